"""A byte-level decoder-only transformer language model (nanoGPT's baby GPT).

Synopsis::

    # TinyShakespeare, downloaded once into ~/.cache/looper/tinyshakespeare
    # (checked against its published sha256), split 90/10 by bytes:
    python -m looper.main --config=experiments/lm.py --workdir=/tmp/lm

    # A folder of text files (e.g. the Python docs' text build), the files
    # matching data.eval_glob (default faq/*) held out:
    python -m looper.main --config=experiments/lm.py --workdir=/tmp/lm \
        --config.data.dir=/data/pydocs

    # Your own folder of text files, its last 10% of bytes held out:
    ... --config.data.dir=/data/books --config.data.eval_glob=''

    # From Python (a notebook, a test):
    from experiments import lm
    from experiments.text import sample
    config = lm.get_config()
    config.data.dir = "/data/pydocs"
    model = lm.model_fn(config)              # int32 [batch, 64] -> [.., 256]
    inputs, labels, weights = lm.dataset_fn(config, "eval")
    print(sample.generate(model, b"The ", 200, context=config.model.context,
                          temperature=0.8, top_k=20, seed=1).decode(
                              errors="replace"))

This file is the experiment: its config, `model_fn` and `dataset_fn`. The
parts are in experiments/text/: `data` (the corpus and its windows),
`model` (the transformer), `metrics` (bits per byte) and `sample` (text
from the model or an export).

The model reads bytes (256 ids, no tokenizer) and predicts the next byte
at every position: inputs int32 [batch, context] -> logits [batch, context,
256]. Each example is one window of the split's byte stream with its
labels, the same window shifted by one byte; the loss is the mean over real
bytes (`loss_normalization="weights"`) and `bits_per_byte` is that mean in
bits, on eval over every byte of the eval split exactly once.

A split is its files (`data.dir` and `data.eval_glob`) or its share of the
bytes (`data.eval_fraction`), as experiments/text/data.py says. Windows of
a split's bytes b (n of them), context T:
* train: inputs b[s:s+T], labels b[s+1:s+T+1] for s = 0, S, 2S, ...,
  S = `model.stride` (0: T // 2, each byte learned with a short and a long
  context; 1: every offset, nanoGPT's random windows, in the order of
  looper's seeded shuffle). All real: no weights. The windows are virtual
  (`looper.data.windows`): the bytes are held once and a batch's windows
  gathered from them when it is drawn, so the stride costs no memory (as
  arrays, stride 1 took 1.3 GB on pydocs); it sets the windows in an
  epoch, (n - T - 1) // S + 1.
* eval: non-overlapping, the last window padded with weight 0: every byte
  but the first is a target exactly once (the weights sum to n - 1), so
  `bits_per_byte` is the whole split's.
"""

import keras
import ml_collections

from experiments import common
from experiments.text import data
from experiments.text import metrics
from experiments.text import model
from looper import config as lc
from looper.data import datasets


def get_config() -> ml_collections.ConfigDict:
  """Returns nanoGPT's baby GPT: 4 layers of 128, context 64, ~2 minutes."""
  # nanoGPT's README run on a laptop CPU: batch 12 for 2000 iterations,
  # windows at random offsets, AdamW at 1e-3 with 100 warmup steps and a
  # cosine decay (to 0 here; nanoGPT stops at 1e-4). Here batch 16 at 3e-3
  # and Keras' initializers (model.init): 2.17-2.20 bits/byte on pydocs'
  # faq/ in ~110 s on 2 CPU cores, against 2.56 with nanoGPT's numbers
  # (docs/pages/benchmarks.md: the LM against plain Keras); XLA: 1.3x the
  # steps/s here, the same losses. On 8 TPU cores batch 16 is 2 windows per core:
  # `looper check` asks for 64 or more.
  # Eval: 256 windows (32 per core on 8) of 64 bytes; pydocs' faq/ (192 KB)
  # is 12 batches.
  c = common.config(model_fn, dataset_fn, steps=2000, batch_size=16,
                    steps_per_loop=100, eval_every=1000, eval_batch_size=256,
                    optimizer="adamw", learning_rate=3e-3, schedule="cosine")
  c.train.jit_compile = True
  c.optimizer.warmup_steps = 100
  # nanoGPT's weight decay and gradient clipping (its train.py defaults).
  c.optimizer.weight_decay = 0.1
  c.optimizer.clip_global_norm = 1.0
  # The loss is the mean over real bytes (weight 1) of the global batch,
  # not over windows: padding never dilutes it.
  c.loss_normalization = "weights"
  c.metrics = (metrics.bits_per_byte, "accuracy")

  c.data.train_split = "train"
  c.data.eval_split = "eval"
  # With data.dir: the eval files, a glob relative to it ('' : hold out the
  # last eval_fraction of the bytes). faq/ is pydocs' suggested eval split.
  c.data.eval_glob = "faq/*"
  # nanoGPT's 90/10 split of one text by bytes (TinyShakespeare, or any
  # data.dir with eval_glob='').
  c.data.eval_fraction = 0.1
  datasets.add_fields(c, cache_dir=data.DEFAULT_CACHE_DIR,
                      url=data.DEFAULT_URL, file_hash=data.DEFAULT_HASH)

  # Transformer blocks, attention heads, and the residual stream's width
  # (heads of width // heads = 32): nanoGPT's baby GPT, 0.83M parameters.
  c.model.layers = lc.whole(4)
  c.model.heads = lc.whole(4)
  c.model.width = lc.whole(128)
  # Bytes a window holds: the most context a prediction sees.
  c.model.context = lc.whole(64)
  # Bytes between the starts of two train windows; 0: context // 2, 1:
  # every offset (nanoGPT's random windows). Any stride costs the same
  # memory and time (virtual windows; see the module doc): a recipe choice.
  c.model.stride = lc.whole(1, low=0)
  # Dropout on the embeddings and each residual branch (looper's: the same
  # curve on any replica count). The baby GPT uses none at 2000 steps.
  c.model.dropout = 0.0
  # Dropout on the attention probabilities (Keras' own inside
  # MultiHeadAttention, made replica-invariant by looper.train.randomness).
  c.model.attention_dropout = 0.0
  # The output projection is the token embedding transposed (logits =
  # h @ E^T), as in GPT-2 and nanoGPT; False: a Dense(256) of its own.
  c.model.tied = True
  # Initial weights (experiments/text/model.py's INITS): 'keras', Keras'
  # layer defaults (glorot_uniform kernels, U(-0.05, 0.05) embeddings), or
  # 'gpt2', N(0, 0.02) everywhere as GPT-2 and nanoGPT. keras learns faster
  # here: 2.38 against 2.56 bits/byte with nanoGPT's recipe (docs/pages/benchmarks.md).
  c.model.init = "keras"
  # Recompute each block's activations in the backward pass instead of
  # keeping them (tf.recompute_grad per block): activation memory of one
  # block, not all (most of it the [batch, heads, T, T] attention at a long
  # context), for one more forward pass per step; the same gradients,
  # dropout included. See experiments/text/model.py's Block.
  c.model.remat = lc.boolean(False)
  return c


def check_config(config: ml_collections.ConfigDict) -> None:
  """What `lc.validate` cannot see in one declared field: width a multiple
  of heads; dropouts in [0, 1); a known init. Raises ConfigError naming
  the field."""
  m = config.model
  if m.init not in model.INITS:
    raise lc.ConfigError(
        f"config.model.init={m.init!r} is not one of"
        f" {', '.join(model.INITS)}; set --config.model.init")
  if m.heads and m.width % m.heads:
    raise lc.ConfigError(
        f"config.model.width={m.width} does not split into"
        f" model.heads={m.heads} heads of equal width; set"
        f" --config.model.width to a multiple of {m.heads}")
  for field in ("dropout", "attention_dropout"):
    if not isinstance(m[field], (int, float)) or not 0 <= m[field] < 1:
      raise lc.ConfigError(
          f"config.model.{field}={m[field]!r} must be in [0, 1); set"
          f" --config.model.{field}")


def model_fn(config: ml_collections.ConfigDict) -> keras.Model:
  """Returns byte ids int32 [batch, context] -> next-byte logits [batch,
  context, 256] (float32): `model.build` on config.model.

  Raises:
    ConfigError: see `check_config`.
  """
  check_config(config)
  return model.build(config.model, vocab=data.VOCAB, seed=config.seed)


def dataset_fn(config: ml_collections.ConfigDict, split: str):
  """Returns `split`'s windows as virtual arrays, one row per example.

  Args:
    config: reads `data.*` and `model.context`, `model.stride`.
    split: 'train' or 'eval' with an optional slice of the windows:
      'train[:50%]'.

  Returns:
    train: (inputs, labels), int32 [N, context] bytes and next bytes; eval:
    (inputs, labels, weights), the weights float32 [N, context], 1.0 for a
    real target, 0.0 for padding. Each a `looper.data.windows.Windows` of
    the split's bytes (np.asarray makes it an array); looper shuffles,
    batches and shards them.

  Raises:
    ConfigError: a bad split or model field, a split too short for one
      window, or what `data.corpus` raises.
  """
  check_config(config)
  field, name = common.split_name(config, split, data.SPLITS,
                                  dataset="the text corpus",
                                  sliced="train[:50%]")
  stream = data.corpus(config.data, name)
  context = config.model.context
  need = context + 1 if name == "train" else 2
  if len(stream) < need:
    raise lc.ConfigError(
        f"config.{field}={split!r}: the {name} split has {len(stream)} bytes,"
        f" fewer than the {need} of one window (model.context={context});"
        " add text to it or lower --config.model.context")
  if name == "train":
    arrays = data.windows(stream, context=context,
                          stride=config.model.stride or max(1, context // 2),
                          pad=False)
  else:
    arrays = data.windows(stream, context=context, stride=context, pad=True)
  _, rows = lc.split_slice(split, len(arrays[0]), field=field)
  return tuple(a[rows] for a in arrays)
