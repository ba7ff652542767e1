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
the eval plan, the seeded shuffle. `sources` picks the mode.

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
import tensorflow as tf

from looper.config import ConfigError

_INFINITE = tf.data.INFINITE_CARDINALITY
_UNKNOWN = tf.data.UNKNOWN_CARDINALITY
INFINITE_EPOCHS = 2**62  # Dataset.range needs an end; this never comes.


def checked(dataset: tf.data.Dataset, split: str) -> tf.data.Dataset:
  """Returns `dataset` if it yields (inputs, label) examples of static shape."""
  if not isinstance(dataset, tf.data.Dataset):
    raise ConfigError(
        f"config.dataset_fn returned {type(dataset).__name__} for split"
        f" {split!r}; return a tf.data.Dataset of (inputs, label) examples")
  spec = dataset.element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2):
    raise ConfigError(
        f"config.dataset_fn yields {spec} for split {split!r}; yield"
        " (inputs, label) pairs, e.g. Dataset.from_tensor_slices((x, y))")
  for part in tf.nest.flatten(spec):
    if not part.shape.is_fully_defined():
      raise ConfigError(
          f"config.dataset_fn yields a component of shape {part.shape} for"
          f" split {split!r}; yield single unbatched examples of static"
          " shape (looper batches them by train.batch_size/eval.batch_size)")
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
                  position: int, split: str | None = None) -> tf.data.Dataset:
  """One input pipeline's endless stream of per-replica train batches.

  Args:
    examples: one pass over the train split, in a fixed order.
    ctx: which input pipeline this is, of how many.
    global_batch_size: examples per step over all replicas.
    seed: epoch e is shuffled with a seed derived from (seed, e).
    shuffle_buffer: 0 keeps the dataset's order.
    position: global examples consumed before this stream starts.
    split: config.data.train_split, named by the error for an empty split.

  Raises:
    ConfigError: the split is empty (the stream would never yield a batch).
  """
  if position % ctx.num_input_pipelines:
    raise ValueError(f"position {position} does not split over"
                     f" {ctx.num_input_pipelines} input pipelines")
  check_nonempty(examples, split)
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
                 *, global_batch_size: int, count: int, steps: int
                 ) -> tf.data.Dataset:
  """One pipeline's per-replica eval batches: `count` real examples, masked.

  The first `count` examples get mask 1; zeros with mask 0 fill the rest of
  `steps` global batches, so shapes stay static and nothing is dropped.
  """
  pad = steps * global_batch_size - count
  with_mask = lambda x, y: (x, y, tf.constant(1.0))
  zero = lambda x, y: (tf.nest.map_structure(tf.zeros_like, x),
                       tf.zeros_like(y), tf.constant(0.0))
  padded = examples.take(count).map(with_mask).concatenate(
      examples.take(1).map(zero).repeat(pad))
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
