"""Bits per byte: a language model's next-byte cross-entropy in bits.

Synopsis::

    from experiments.text import metrics
    c.metrics = (metrics.bits_per_byte, "accuracy")   # in get_config()

With `loss_normalization="weights"` and the eval windows' 0/1 weights, its
eval value is the loss over every real byte of the eval split, in bits.
"""

import math

import keras

_LN2 = math.log(2.0)


class BitsPerByte(keras.metrics.Mean):
  """The weighted mean next-byte cross-entropy, in bits (nats / ln 2)."""

  def __init__(self, name: str = "bits_per_byte", dtype=None):
    super().__init__(name=name, dtype=dtype)

  def update_state(self, y_true, y_pred, sample_weight=None):
    """Labels int [batch, T], logits [batch, T, 256]; sample_weight
    [batch, T] (a byte's weight), [batch] (a window's) or None."""
    nats = keras.losses.sparse_categorical_crossentropy(
        y_true, keras.ops.cast(y_pred, "float32"), from_logits=True)
    return super().update_state(nats / _LN2, sample_weight=sample_weight)


def bits_per_byte() -> BitsPerByte:
  """The metric factory for `config.metrics`."""
  return BitsPerByte()
