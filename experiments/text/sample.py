"""Text sampled from the byte language model, or from its export.

Synopsis::

    from experiments.text import sample
    # The Keras model (lm.model_fn, or a restored Trainer's .model):
    print(sample.generate(model, b"The ", 200, context=64, temperature=0.8,
                          top_k=20, seed=1).decode(errors="replace"))

    # An export (--mode=export, or export.at_end=True), with TensorFlow alone:
    serve = tf.saved_model.load("/tmp/lm/export/800").signatures[
        "serving_default"]
    sample.generate(lambda x: serve(inputs=tf.constant(x))["logits"], b"The ",
                    200, context=64)

`generate` samples with a fixed [1, context] window (one XLA or serving
shape): a short prompt is padded on the right, which the causal mask makes
irrelevant, and the logits are read at its last real byte.
"""

from typing import Callable

import numpy as np

from experiments.text import data


def _whole(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def generate(logits_fn: Callable, prompt: bytes, num_bytes: int, *,
             context: int, temperature: float = 1.0, top_k: int | None = None,
             seed: int = 0) -> bytes:
  """Returns `num_bytes` bytes sampled after `prompt`, one at a time.

  Args:
    logits_fn: int32 [1, context] -> logits [1, context, 256]: the Keras
      model, or an export's `lambda x: serve(inputs=tf.constant(x))[
      "logits"]` (module doc).
    prompt: the text to continue; only its last `context` bytes are seen.
      Empty: b"\\0", the separator before a document.
    num_bytes: how many bytes to generate (>= 0).
    context: the model's window, config.model.context.
    temperature: the logits are divided by it; 0: the most likely byte.
    top_k: sample among the k most likely bytes only (None: all 256).
    seed: the sampling's seed; the same seed gives the same bytes.

  Raises:
    ValueError: an argument out of range (named).
  """
  if not isinstance(prompt, (bytes, bytearray)):
    raise TypeError(f"generate: prompt must be bytes, got"
                    f" {type(prompt).__name__}; pass text.encode()")
  if not _whole(context) or context < 1:
    raise ValueError(f"generate: context={context!r} must be >= 1 (the"
                     " model's config.model.context)")
  if not _whole(num_bytes) or num_bytes < 0:
    raise ValueError(f"generate: num_bytes={num_bytes!r} must be >= 0")
  if not temperature >= 0:
    raise ValueError(f"generate: temperature={temperature!r} must be >= 0"
                     " (0: greedy)")
  if top_k is not None and (not _whole(top_k) or
                            not 1 <= top_k <= data.VOCAB):
    raise ValueError(f"generate: top_k={top_k!r} must be in"
                     f" 1..{data.VOCAB} or None")
  rng = np.random.default_rng(seed)
  text = bytearray(prompt or data.SEPARATOR)
  start = len(text)
  window = np.zeros((1, context), np.int32)
  for _ in range(num_bytes):
    seen = text[-context:]
    # Right-padded: one static shape; the causal mask hides the padding
    # from every real position.
    window[:] = 0
    window[0, :len(seen)] = np.frombuffer(bytes(seen), np.uint8)
    logits = np.asarray(logits_fn(window), np.float64)[0, len(seen) - 1]
    if temperature == 0:
      text.append(int(np.argmax(logits)))
      continue
    logits = logits / temperature
    if top_k is not None and top_k < data.VOCAB:
      kth = np.sort(logits)[-top_k]
      logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max())
    text.append(int(rng.choice(data.VOCAB, p=probs / probs.sum())))
  return bytes(text[start:])
