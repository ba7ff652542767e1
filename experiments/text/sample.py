"""Text sampled from the byte language model, or from its export.

Synopsis::

    from experiments.text import sample
    # The Keras model (lm.model_fn, or a restored Trainer's .model): its
    # keys and values cached, one position computed per byte:
    print(sample.generate(model, b"The ", 200, context=64, temperature=0.8,
                          top_k=20, seed=1).decode(errors="replace"))

    # An export (--mode=export, or export.at_end=True), with TensorFlow alone:
    # the whole window per byte, the same bytes.
    serve = tf.saved_model.load("/tmp/lm/export/800").signatures[
        "serving_default"]
    sample.generate(lambda x: serve(inputs=tf.constant(x))["logits"], b"The ",
                    200, context=64)

The window. The model's positions are learned, a vector for each of its
`context` positions, so a cached key or value belongs to its byte at one
position of one window: when the text outgrows the window, sliding it by a
byte would move every byte and void the whole cache. So each byte is
predicted from a window that starts where the last one started and grows
by the byte just drawn; when it would exceed `context` bytes it restarts
from the last `keep` bytes (context // 2 by default). A byte sees between
`keep` and `context` bytes (a prompt longer than the context: its last
`context` bytes for the first). keep=context slides by one byte, every
byte seeing the last `context` (the sampler before the cache, at its cost).

Two computations of those windows' logits, the same bytes (the logits
agree to ~1e-7; tested greedy and seeded):
- cached, for a Keras model of `model.build`: a new window is run once
  through `model.Decoder` at the fixed [1, context] shape (its padding
  after the real bytes masked, later overwritten), then each byte alone
  against the cached keys and values: per byte one position, not a
  window, plus one window every context - keep + 1 bytes.
- whole-window, for any other `logits_fn` (an export, `lambda x:
  model(x)`): the window right-padded to [1, context] (one XLA or serving
  shape; the causal mask hides the padding), the logits read at its last
  real byte.
"""

from typing import Callable
import weakref

import keras
import numpy as np

from experiments.text import data
from experiments.text import model as model_lib


# Each model's Decoder, kept while the model lives: its two traced graphs
# serve every later call (a trace takes ~1 s, a byte ~1 ms).
_DECODERS = weakref.WeakKeyDictionary()


def _whole(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def generate(logits_fn: Callable, prompt: bytes, num_bytes: int, *,
             context: int, temperature: float = 1.0, top_k: int | None = None,
             seed: int = 0, keep: int | None = None) -> bytes:
  """Returns `num_bytes` bytes sampled after `prompt`, one at a time.

  Args:
    logits_fn: a Keras model of `model.build` (sampled through its cache),
      or any int32 [1, context] -> logits [1, context, 256] (the whole
      window per byte): an export's `lambda x: serve(inputs=tf.constant(
      x))["logits"]` (module doc), `lambda x: model(x)`.
    prompt: the text to continue; only its last `context` bytes are seen.
      Empty: b"\\0", the separator before a document.
    num_bytes: how many bytes to generate (>= 0).
    context: the model's window, config.model.context.
    temperature: the logits are divided by it; 0: the most likely byte.
    top_k: sample among the k most likely bytes only (None: all 256).
    seed: the sampling's seed; the same seed gives the same bytes.
    keep: the bytes a full window restarts from, 1..context (module doc);
      None: context // 2 (at least 1).

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
  keep = max(1, context // 2) if keep is None else keep
  if not _whole(keep) or not 1 <= keep <= context:
    raise ValueError(f"generate: keep={keep!r} must be in 1..{context}"
                     " (context) or None")
  if isinstance(logits_fn, keras.Model):
    next_logits = _Cached(logits_fn, context)
  else:
    next_logits = _whole_window(logits_fn, context)
  rng = np.random.default_rng(seed)
  text = bytearray(prompt or data.SEPARATOR)
  first = len(text)
  start = max(0, len(text) - context)  # the window is text[start:]
  for _ in range(num_bytes):
    if len(text) - start > context:
      start = len(text) - keep
    text.append(_draw(next_logits(text, start), rng, temperature, top_k))
  return bytes(text[first:])


def _window(text: bytearray, start: int, context: int) -> np.ndarray:
  """text[start:] as int32 [1, context], right-padded with 0."""
  window = np.zeros((1, context), np.int32)
  seen = bytes(text[start:])
  window[0, :len(seen)] = np.frombuffer(seen, np.uint8)
  return window


def _whole_window(logits_fn: Callable, context: int) -> Callable:
  """(text, start) -> the next byte's logits from the window text[start:],
  computed whole."""
  def next_logits(text, start):
    logits = logits_fn(_window(text, start, context))
    return np.asarray(logits, np.float64)[0, len(text) - start - 1]
  return next_logits


class _Cached:
  """(text, start) -> the next byte's logits from the window text[start:]
  through `model.Decoder`: a new start runs the window, the same start
  the byte appended since the last call (generate's one at a time)."""

  def __init__(self, net: keras.Model, context: int):
    if net not in _DECODERS:
      _DECODERS[net] = model_lib.Decoder(net)
    self.decoder = _DECODERS[net]
    if self.decoder.context != context:
      raise ValueError(f"generate: context={context} is not the model's"
                       f" ({self.decoder.context}); pass"
                       f" context={self.decoder.context}")
    self.cache = self.decoder.empty(batch=1)
    self.start = None

  def __call__(self, text: bytearray, start: int) -> np.ndarray:
    last = len(text) - start - 1  # the window's last byte
    if start != self.start:  # a new window: run it whole
      self.start = start
      ids, at, row = _window(text, start, self.decoder.context), 0, last
    else:  # the byte drawn since the last call, at its position
      ids, at, row = np.array([[text[-1]]], np.int32), last, 0
    logits, self.cache = self.decoder(ids, at, self.cache)
    return np.asarray(logits, np.float64)[0, row]


def _draw(logits: np.ndarray, rng: np.random.Generator, temperature: float,
          top_k: int | None) -> int:
  """A byte from float64 logits [256]: the argmax at temperature 0, else
  drawn from the softmax of logits / temperature over the top_k."""
  if temperature == 0:
    return int(np.argmax(logits))
  logits = logits / temperature
  if top_k is not None and top_k < data.VOCAB:
    kth = np.sort(logits)[-top_k]
    logits = np.where(logits < kth, -np.inf, logits)
  probs = np.exp(logits - logits.max())
  return int(rng.choice(data.VOCAB, p=probs / probs.sum()))
