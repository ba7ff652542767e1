"""Variable-length examples (`data.bucket`): few shapes, padded per batch.

Synopsis::

    batches = buckets.train_dataset(examples, ctx, batch_size=32,
                                    seed=0, shuffle_buffer=1000, position=0,
                                    bucket=16, split="train")
    size, batches = buckets.epoch_batches(examples, batch_size=32,
                                          bucket=16)  # in one epoch
    masked = buckets.eval_dataset(examples, ctx, batch_size=32,
                                  count=n, steps=s, bucket=16)

Element mode for inputs with a dimension of unknown size (text): each
global batch holds examples of one length bucket and is padded to it, a
multiple of `bucket`, so a run sees at most max length / bucket shapes (XLA
programs). Exact on any topology and on resume, like element mode.
"""

import numpy as np
import tensorflow as tf

from looper import autograph
from looper.data import elements
from looper.errors import ConfigError


def train_dataset(examples: tf.data.Dataset,
                  ctx: tf.distribute.InputContext, *, batch_size: int,
                  seed: int, shuffle_buffer: int, position: int, bucket: int,
                  split: str | None = None) -> tf.data.Dataset:
  """Train batches of variable-length examples, few distinct shapes.

  Epoch e is shuffled as usual, then its examples are grouped by length
  bucket (length: the largest unknown dimension of an example's inputs,
  bucket: ceil(length / bucket)); a bucket that fills a global batch emits
  it, its unknown dimensions padded to bucket * `bucket`. A bucket's last
  partial batch of the epoch is dropped, so every epoch has the same number
  of batches, sum over buckets of n_b // B: a restart jumps to its epoch
  and skips batches within it. All pipelines see the same global order and
  keep their block of each global batch (exact on any topology).
  """
  elements.check_start(examples, ctx, position, split)
  key = _key(bucket)
  size, per_epoch = epoch_batches(
      examples, batch_size=batch_size, bucket=bucket,
      split=split)
  start_epoch, offset = divmod(position // batch_size, per_epoch)
  buffer = min(shuffle_buffer, size)

  @autograph.plain
  def epoch(e):
    shuffled = elements.seeded_shuffle(examples, buffer, seed, e,
                                       enabled=buffer > 0)
    return shuffled.group_by_window(
        key_func=key, window_size=batch_size,
        reduce_func=autograph.plain(lambda k, window: window.padded_batch(
            batch_size, drop_remainder=True,
            padded_shapes=_bucket_shapes(window.element_spec, k * bucket))))

  batches = tf.data.Dataset.range(
      start_epoch, elements.INFINITE_EPOCHS).flat_map(epoch).skip(offset)
  return elements.blocks(batches, ctx, batch_size)


def epoch_batches(examples: tf.data.Dataset, *, batch_size: int,
                  bucket: int, split: str | None = None) -> tuple[int, int]:
  """(examples, global batches) of one epoch of `train_dataset`: every
  example's bucket, by one pass, then sum over buckets of n_b // B.

  Raises:
    ConfigError: no bucket holds a whole batch (the stream would be empty).
  """
  ids = examples.map(_key(bucket)).batch(4096).reduce(
      tf.zeros([0], tf.int64),
      autograph.plain(lambda a, b: tf.concat([a, b], 0))).numpy()
  per_epoch = int(sum(n // batch_size
                      for n in np.bincount(ids) if n))
  if not per_epoch:
    raise ConfigError(
        f"config.data.bucket={bucket}: no length bucket of split {split!r}"
        f" holds a whole batch of {batch_size} examples; raise"
        " --config.data.bucket or lower --config.train.batch_size")
  return len(ids), per_epoch


def eval_dataset(examples: tf.data.Dataset, ctx: tf.distribute.InputContext,
                 *, batch_size: int, count: int, steps: int,
                 bucket: int) -> tf.data.Dataset:
  """Eval batches as in element mode, each global batch (in the split's
  order) padded to its longest example rounded up to a multiple of
  `bucket`."""
  batches = elements.masked(examples, count, steps * batch_size
                            ).padded_batch(batch_size).map(
                                autograph.plain(lambda x, *rest: (
                                    _pad_to_multiple(x, bucket), *rest)))
  return elements.blocks(batches, ctx, batch_size)


def _key(bucket: int):
  """An example's length bucket: ceil(length / bucket), at least 1."""
  return autograph.plain(
      lambda x, *_: tf.maximum((_length(x) + bucket - 1) // bucket, 1))


def _length(inputs) -> tf.Tensor:
  """The largest unknown-size dimension of one example's inputs (int64)."""
  sizes = [tf.shape(t, out_type=tf.int64)[axis]
           for t in tf.nest.flatten(inputs)
           for axis, d in enumerate(t.shape) if d is None]
  return tf.reduce_max(tf.stack(sizes)) if sizes else tf.constant(0, tf.int64)


def _bucket_shapes(spec, length):
  """padded_shapes for one example: unknown dimensions -> `length`."""
  def shape(s):
    return tf.stack([length if d is None else tf.constant(d, tf.int64)
                     for d in s.shape]) if s.shape.rank else []
  return tf.nest.map_structure(shape, spec)


def _pad_to_multiple(inputs, bucket: int):
  """A padded batch's unknown dimensions rounded up to multiples of bucket.

  At least one bucket, as in training: a batch of empty examples gets the
  shape of the first bucket, not a shape of its own with length 0.
  """
  def target(size):
    return tf.maximum((size + bucket - 1) // bucket, 1) * bucket

  def pad(t):
    paddings = [[0, 0]] + [
        [0, target(tf.shape(t)[axis]) - tf.shape(t)[axis] if d is None else 0]
        for axis, d in enumerate(t.shape[1:].as_list(), 1)]
    return tf.pad(t, paddings)
  return tf.nest.map_structure(pad, inputs)
