"""Element mode: one global example order, each pipeline keeps its block.

Synopsis::

    batches = elements.train_dataset(examples, ctx, batch_size=128,
                                     seed=0, shuffle_buffer=10_000,
                                     position=0, split="train")
    count, steps = elements.eval_plan(num_examples, batch_size=256,
                                      steps=None)
    masked = elements.eval_dataset(examples, ctx, batch_size=256,
                                   count=count, steps=steps)

Element mode takes any Dataset of single examples; `sources` picks the
mode, `buckets` extends it to variable-length examples. The seeded
per-epoch shuffle, the eval plan and the per-replica split are used by the
other modes too.

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

Train batches are `(inputs, labels)` or `(inputs, labels, weights)` as the
examples are; eval batches end with the mask: `(inputs, labels[, weights],
mask)`.
"""

import math

import tensorflow as tf

from looper import autograph
from looper.data import checks

INFINITE_EPOCHS = 2**62  # Dataset.range needs an end; this never comes.


def train_dataset(examples: tf.data.Dataset, ctx: tf.distribute.InputContext,
                  *, batch_size: int, seed: int, shuffle_buffer: int,
                  position: int, split: str | None = None
                  ) -> tf.data.Dataset:
  """One input pipeline's endless stream of per-replica train batches.

  Args:
    examples: one pass over the train split, in a fixed order.
    ctx: which input pipeline this is, of how many.
    batch_size: examples of one batch over all replicas (one next():
      train.batch_size; an update may take several, train.grad_accum_steps).
    seed: epoch e is shuffled with a seed derived from (seed, e).
    shuffle_buffer: 0 keeps the dataset's order.
    position: global examples consumed before this stream starts.
    split: config.data.train_split, named by the error for an empty split.

  Raises:
    ConfigError: the split is empty (the stream would never yield a batch).
  """
  check_start(examples, ctx, position, split)
  size = int(examples.cardinality())
  # With a known epoch size we can jump straight to the epoch; without, the
  # stream restarts at epoch 0 and skips (slower, equally exact).
  start_epoch, offset = divmod(position, size) if size > 0 else (0, position)
  buffer = min(shuffle_buffer, size) if size > 0 else shuffle_buffer

  epoch = autograph.plain(lambda e: seeded_shuffle(
      examples, buffer, seed, e, enabled=buffer > 0))
  stream = tf.data.Dataset.range(start_epoch, INFINITE_EPOCHS).flat_map(epoch)
  return per_replica_batches(stream.skip(offset), ctx, batch_size)


def check_start(examples: tf.data.Dataset, ctx: tf.distribute.InputContext,
                position: int, split: str | None) -> None:
  """A train stream can start: the split has examples and `position`
  splits over the input pipelines."""
  if position % ctx.num_input_pipelines:
    raise ValueError(f"position {position} does not split over"
                     f" {ctx.num_input_pipelines} input pipelines")
  checks.check_nonempty(examples, split)


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
                 *, batch_size: int, count: int, steps: int
                 ) -> tf.data.Dataset:
  """One pipeline's per-replica eval batches: `count` real examples, masked."""
  return per_replica_batches(masked(examples, count, steps * batch_size),
                             ctx, batch_size)


def masked(examples: tf.data.Dataset, count: int, total: int
           ) -> tf.data.Dataset:
  """`(inputs, label[, weight], mask)`: the first `count` examples with
  mask 1, then zeros with mask 0 up to `total`, so eval shapes stay static
  and nothing is dropped."""
  with_mask = autograph.plain(lambda *example: (*example,
                                                  tf.constant(1.0)))
  zero = autograph.plain(lambda *example: (
      *tf.nest.map_structure(tf.zeros_like, example), tf.constant(0.0)))
  return examples.take(count).map(with_mask).concatenate(
      examples.take(1).map(zero).repeat(total - count))


def per_replica_batches(stream: tf.data.Dataset,
                         ctx: tf.distribute.InputContext,
                         batch_size: int) -> tf.data.Dataset:
  """This pipeline's share of one global example order, in replica batches.

  Global batch k is stream examples [kB, (k+1)B); pipeline p of P takes the
  p-th block of B/P of them and splits it among its replicas in order. So
  replica r of R always gets the r-th B/R of the global batch: an example's
  place in the global batch is the same on any topology (what per-example
  randomness such as `layers.Dropout` relies on).
  """
  pipelines = ctx.num_input_pipelines
  return (stream.batch(batch_size // pipelines, drop_remainder=True)
          .shard(pipelines, ctx.input_pipeline_id)
          .rebatch(ctx.get_per_replica_batch_size(batch_size),
                   drop_remainder=True)
          .prefetch(tf.data.AUTOTUNE))


def blocks(batches: tf.data.Dataset, ctx: tf.distribute.InputContext,
            batch_size: int) -> tf.data.Dataset:
  """Global batches -> this pipeline's block, split among its replicas."""
  block = batch_size // ctx.num_input_pipelines
  start = ctx.input_pipeline_id * block
  return (batches.map(autograph.plain(lambda *b: tf.nest.map_structure(
      lambda t: t[start:start + block], b)))
          .rebatch(ctx.get_per_replica_batch_size(batch_size),
                   drop_remainder=True)
          .prefetch(tf.data.AUTOTUNE))


def eval_plan(num: int, batch_size: int, steps) -> tuple[int, int]:
  """(examples evaluated, global steps) for a split of `num` examples.

  Args:
    num: examples in the eval split.
    batch_size: eval batch over all replicas.
    steps: None for the whole split, else at most this many batches.
  """
  whole = math.ceil(num / batch_size)
  steps = whole if steps is None else min(steps, whole)
  return min(num, steps * batch_size), steps
