"""The parts of experiments/lm.py, the byte-level language model.

- `data`: a folder of text files (or TinyShakespeare) as one byte stream
  per split, and the stream cut into windows.
- `model`: the decoder-only transformer and its two layers.
- `metrics`: bits per byte.
- `sample`: text sampled from the model or an export.

experiments/lm.py holds the config, `model_fn` and `dataset_fn`; these
modules hold what they call.
"""
