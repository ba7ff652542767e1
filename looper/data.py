"""From an experiment's examples to per-replica batches: looper owns batching.

Synopsis::

    examples = data.checked(dataset_fn(config, split), split)
    batches = data.train_dataset(examples, ctx, global_batch_size=128,
                                 seed=0, shuffle_buffer=10_000, position=0,
                                 split="train")   # an empty split: error
    count, steps = data.eval_plan(num_examples, global_batch_size=256,
                                  steps=None)
    masked = data.eval_dataset(examples, ctx, global_batch_size=256,
                               count=count, steps=steps)

This is element mode (any Dataset) and what every mode shares: the checks,
the eval plan, the seeded shuffle. `sources` picks the mode. With `bucket`
(config.data.bucket) the inputs may vary in length: each global batch holds
one length bucket and is padded to it (`_bucketed_train`).

Why looper batches (and the experiment returns single examples):
* Exact math on any replica count. All input pipelines see ONE global order
  (the same seeded shuffle on every worker); pipeline p keeps the p-th block
  of each global batch and splits it per replica, so global batch k holds
  the same examples, in the same places, whether there are 1, 2, 8
  replicas or 2 workers.
* Exact resume. The data position is a count of global examples consumed.
  Every epoch is shuffled with a seed derived from its number, so a restart
  jumps straight to the right epoch and skips only within it.
* Exact eval. The eval split is padded to whole global batches with examples
  whose mask is 0, so every example is counted once at a static shape.

Train batches are `(inputs, labels)`; eval batches `(inputs, labels, mask)`.
"""

import math

import numpy as np
import tensorflow as tf

from looper.config import ConfigError

_INFINITE = tf.data.INFINITE_CARDINALITY
_UNKNOWN = tf.data.UNKNOWN_CARDINALITY
INFINITE_EPOCHS = 2**62  # Dataset.range needs an end; this never comes.


def checked(dataset: tf.data.Dataset, split: str,
            variable: bool = False) -> tf.data.Dataset:
  """Returns `dataset` if it yields (inputs, label) examples of static shape.

  `variable` (config.data.bucket is set): the inputs may have dimensions of
  unknown size (padded per batch) but must be plain tensors of known rank;
  the label must still be static.
  """
  if not isinstance(dataset, tf.data.Dataset):
    raise ConfigError(
        f"config.dataset_fn returned {type(dataset).__name__} for split"
        f" {split!r}; return a tf.data.Dataset of (inputs, label) examples")
  spec = dataset.element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2):
    raise ConfigError(
        f"config.dataset_fn yields {spec} for split {split!r}; yield"
        " (inputs, label) pairs, e.g. Dataset.from_tensor_slices((x, y))")
  inputs, label = spec
  for part in tf.nest.flatten(label if variable else spec):
    if not part.shape.is_fully_defined():
      raise ConfigError(
          f"config.dataset_fn yields a component of shape {part.shape} for"
          f" split {split!r}; yield single unbatched examples of static"
          " shape (looper batches them by train.batch_size/eval.batch_size),"
          " or set --config.data.bucket to pad variable-length inputs")
  for part in tf.nest.flatten(inputs) if variable else []:
    # padded_batch pads plain tensors only; a row sliced from a RaggedTensor
    # is one until a map turns it into a tensor.
    if not isinstance(part, tf.TensorSpec):
      raise ConfigError(
          f"config.dataset_fn yields inputs of type {type(part).__name__} for"
          f" split {split!r}; yield plain tensors of variable length, e.g."
          " add .map(lambda x, y: (x, y)) after from_tensor_slices(ragged)")
    if part.shape.rank is None:
      raise ConfigError(
          f"config.dataset_fn yields inputs of unknown rank for split"
          f" {split!r}; give every input a known rank (tf.ensure_shape)")
  return dataset


def num_examples(dataset: tf.data.Dataset, split: str,
                 field: str = "data.eval_split") -> int:
  """Size of a finite, non-empty dataset; counted by one pass if TF cannot tell.

  Raises:
    ConfigError: the dataset is endless or empty (`field` names the split).
  """
  n = int(dataset.cardinality())
  if n == _INFINITE:
    raise ConfigError(
        f"config.dataset_fn returned an endless dataset for split {split!r};"
        " return one pass over the data (looper repeats the train split)")
  if n == _UNKNOWN:
    n = int(dataset.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
  if not n:
    raise empty_split(split, field)
  return n


def check_nonempty(dataset: tf.data.Dataset, split: str | None,
                   field: str = "data.train_split") -> tf.data.Dataset:
  """Returns `dataset` if it has an example; reads at most one to find out.

  An empty train split would make the endless epoch stream of
  `train_dataset` spin forever without yielding a batch, so it must be
  caught before training starts.

  Args:
    dataset: one pass over a split, e.g. from `checked`.
    split: the split's name as configured (None: not known here).
    field: the config field that names the split, for the error.

  Raises:
    ConfigError: the dataset has no examples.
  """
  n = int(dataset.cardinality())
  # Unknown (e.g. after a filter): take one example rather than count, so a
  # non-empty split costs one element, not a pass. Only eagerly, as a graph
  # cannot run the probe; distribute_datasets_from_function calls its
  # dataset function eagerly, so `train_dataset` is covered.
  if n == _UNKNOWN and tf.executing_eagerly():
    n = sum(1 for _ in dataset.take(1))
  if not n:
    raise empty_split(split, field)
  return dataset


def empty_split(split: str | None, field: str) -> ConfigError:
  value = "" if split is None else f"={split!r}"
  return ConfigError(
      f"config.{field}{value} selects no examples: config.dataset_fn returned"
      f" an empty dataset; widen --config.{field} or check the data"
      " dataset_fn reads")


def check_class_labels(labels: tf.Tensor, logits: tf.Tensor,
                       split: str) -> None:
  """Class-id labels for logits [batch, classes]: integer, scalar, in range.

  Raises:
    ConfigError: float labels (silently truncated by the loss), one-hot or
      other non-scalar labels, or ids outside [0, classes).
  """
  where = f"config.dataset_fn yields labels for split {split!r}"
  if not labels.dtype.is_integer:
    raise ConfigError(
        f"{where} of dtype {labels.dtype.name}; class ids must be integers:"
        " tf.cast(label, tf.int32) in dataset_fn (or use another config.loss)")
  if labels.shape.rank != 1:
    raise ConfigError(
        f"{where} of shape {labels.shape[1:].as_list()} each; give one class"
        " id per example (shape []): not one-hot, not [1]")
  if logits.shape.rank != 2:
    raise ConfigError(
        f"config.model_fn returns outputs of shape"
        f" {logits.shape[1:].as_list()} per example; return logits of shape"
        " [classes] for config.loss='sparse_categorical_crossentropy'")
  classes = logits.shape[-1]
  low, high = int(tf.reduce_min(labels)), int(tf.reduce_max(labels))
  if low < 0 or high >= classes:
    raise ConfigError(
        f"{where} up to {high} (from {low}), but the model has {classes}"
        f" outputs; class ids must lie in [0, {classes}): widen the model's"
        " last layer or fix the labels")


def check_divisible(global_batch_size: int, replicas: int, field: str):
  """Every replica must get the same number of examples."""
  if global_batch_size % replicas:
    fit = replicas * max(1, round(global_batch_size / replicas))
    raise ConfigError(
        f"config.{field}={global_batch_size} is not divisible by the"
        f" {replicas} replicas; set --config.{field}={fit}")


def train_dataset(examples: tf.data.Dataset, ctx: tf.distribute.InputContext,
                  *, global_batch_size: int, seed: int, shuffle_buffer: int,
                  position: int, split: str | None = None,
                  bucket: int = 0) -> tf.data.Dataset:
  """One input pipeline's endless stream of per-replica train batches.

  Args:
    examples: one pass over the train split, in a fixed order.
    ctx: which input pipeline this is, of how many.
    global_batch_size: examples per step over all replicas.
    seed: epoch e is shuffled with a seed derived from (seed, e).
    shuffle_buffer: 0 keeps the dataset's order.
    position: global examples consumed before this stream starts.
    split: config.data.train_split, named by the error for an empty split.
    bucket: config.data.bucket; > 0: see `_bucketed_train`.

  Raises:
    ConfigError: the split is empty (the stream would never yield a batch).
  """
  if position % ctx.num_input_pipelines:
    raise ValueError(f"position {position} does not split over"
                     f" {ctx.num_input_pipelines} input pipelines")
  check_nonempty(examples, split)
  if bucket:
    return _bucketed_train(examples, ctx, global_batch_size, seed,
                           shuffle_buffer, position, bucket, split)
  size = int(examples.cardinality())
  # With a known epoch size we can jump straight to the epoch; without, the
  # stream restarts at epoch 0 and skips (slower, equally exact).
  start_epoch, offset = divmod(position, size) if size > 0 else (0, position)
  buffer = min(shuffle_buffer, size) if size > 0 else shuffle_buffer

  epoch = lambda e: seeded_shuffle(examples, buffer, seed, e,
                                   enabled=buffer > 0)
  stream = tf.data.Dataset.range(start_epoch, INFINITE_EPOCHS).flat_map(epoch)
  return _per_replica_batches(stream.skip(offset), ctx, global_batch_size)


def seeded_shuffle(dataset: tf.data.Dataset, buffer, seed: int, op_seed,
                   enabled: bool = True) -> tf.data.Dataset:
  """`dataset` shuffled in an order that comes from (seed, op_seed) alone.

  Call it inside a tf.data function (e.g. per epoch in a flat_map, op_seed
  the epoch), so a restart can begin at any epoch.
  """
  if not enabled:
    return dataset
  # Setting the graph-level seed here keeps the process's global seed out of
  # the order, and keeps it non-zero: with a zero graph seed TF compares the
  # tensor op seed as a Python bool and fails.
  tf.random.set_seed(seed % (2**31 - 2) + 1)
  return dataset.shuffle(buffer, seed=op_seed)


def eval_dataset(examples: tf.data.Dataset, ctx: tf.distribute.InputContext,
                 *, global_batch_size: int, count: int, steps: int,
                 bucket: int = 0) -> tf.data.Dataset:
  """One pipeline's per-replica eval batches: `count` real examples, masked.

  The first `count` examples get mask 1; zeros with mask 0 fill the rest of
  `steps` global batches, so shapes stay static and nothing is dropped.
  With `bucket`, each global batch (in the split's order) is padded to its
  longest example rounded up to a multiple of `bucket`.
  """
  pad = steps * global_batch_size - count
  with_mask = lambda x, y: (x, y, tf.constant(1.0))
  zero = lambda x, y: (tf.nest.map_structure(tf.zeros_like, x),
                       tf.zeros_like(y), tf.constant(0.0))
  padded = examples.take(count).map(with_mask).concatenate(
      examples.take(1).map(zero).repeat(pad))
  if bucket:
    batches = padded.padded_batch(global_batch_size).map(
        lambda x, y, m: (_pad_to_multiple(x, bucket), y, m))
    return _blocks(batches, ctx, global_batch_size)
  return _per_replica_batches(padded, ctx, global_batch_size)


def _per_replica_batches(stream: tf.data.Dataset,
                         ctx: tf.distribute.InputContext,
                         global_batch_size: int) -> tf.data.Dataset:
  """This pipeline's share of one global example order, in replica batches.

  Global batch k is stream examples [kB, (k+1)B); pipeline p of P takes the
  p-th block of B/P of them and splits it among its replicas in order. So
  replica r of R always gets the r-th B/R of the global batch: an example's
  place in the global batch is the same on any topology (what per-example
  randomness such as `layers.Dropout` relies on).
  """
  pipelines = ctx.num_input_pipelines
  return (stream.batch(global_batch_size // pipelines, drop_remainder=True)
          .shard(pipelines, ctx.input_pipeline_id)
          .rebatch(ctx.get_per_replica_batch_size(global_batch_size),
                   drop_remainder=True)
          .prefetch(tf.data.AUTOTUNE))


def _bucketed_train(examples, ctx, global_batch_size, seed, shuffle_buffer,
                    position, bucket, split):
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
  key = lambda x, y: tf.maximum((_length(x) + bucket - 1) // bucket, 1)
  ids = examples.map(key).batch(4096).reduce(
      tf.zeros([0], tf.int64), lambda a, b: tf.concat([a, b], 0)).numpy()
  per_epoch = int(sum(n // global_batch_size
                      for n in np.bincount(ids) if n))
  if not per_epoch:
    raise ConfigError(
        f"config.data.bucket={bucket}: no length bucket of split {split!r}"
        f" holds a whole batch of {global_batch_size} examples; raise"
        " --config.data.bucket or lower --config.train.batch_size")
  start_epoch, offset = divmod(position // global_batch_size, per_epoch)
  size = len(ids)
  buffer = min(shuffle_buffer, size)

  def epoch(e):
    shuffled = seeded_shuffle(examples, buffer, seed, e, enabled=buffer > 0)
    return shuffled.group_by_window(
        key_func=key, window_size=global_batch_size,
        reduce_func=lambda k, window: window.padded_batch(
            global_batch_size, drop_remainder=True,
            padded_shapes=_bucket_shapes(window.element_spec, k * bucket)))

  batches = tf.data.Dataset.range(start_epoch, INFINITE_EPOCHS).flat_map(
      epoch).skip(offset)
  return _blocks(batches, ctx, global_batch_size)


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


def _blocks(batches: tf.data.Dataset, ctx: tf.distribute.InputContext,
            global_batch_size: int) -> tf.data.Dataset:
  """Global batches -> this pipeline's block, split among its replicas."""
  block = global_batch_size // ctx.num_input_pipelines
  start = ctx.input_pipeline_id * block
  return (batches.map(lambda *b: tf.nest.map_structure(
      lambda t: t[start:start + block], b))
          .rebatch(ctx.get_per_replica_batch_size(global_batch_size),
                   drop_remainder=True)
          .prefetch(tf.data.AUTOTUNE))


def eval_plan(num: int, global_batch_size: int, steps) -> tuple[int, int]:
  """(examples evaluated, global steps) for a split of `num` examples.

  Args:
    num: examples in the eval split.
    global_batch_size: eval batch over all replicas.
    steps: None for the whole split, else at most this many batches.
  """
  whole = math.ceil(num / global_batch_size)
  steps = whole if steps is None else min(steps, whole)
  return min(num, steps * global_batch_size), steps
