"""Array mode: in-memory examples shuffled by index, each pipeline gathers its own.

Synopsis::

    def dataset_fn(config, split):
      return images, labels             # numpy arrays (or nests of them),
                                        # optionally a third: sample weights;
                                        # any of them may be a
                                        # windows.Windows (virtual rows)

    source = arrays.Arrays((images, labels), split="train")
    batches = source.train(ctx, batch_size=128, seed=0,
                           shuffle_buffer=1, position=0)

When `dataset_fn` returns arrays instead of a Dataset, looper has random
access, so no pipeline needs to read what it does not train on:
* Epoch e is a full permutation of [0, N) from (seed, e)
  (`tf.random.experimental.index_shuffle`: computed per index, never
  materialised). Global example j of the stream is example
  perm_{j // N}(j % N).
* Global batch k is stream positions [kB, (k+1)B); replica r of R takes the
  r-th slice of B/R of them, so which examples form a global batch does not
  depend on the replica or worker count.
* Resume is O(1): the stream simply starts at position `position`.
* Eval: global batch k's slots beyond the split are padding (mask 0).

`shuffle_buffer=0` keeps the arrays' order (identity permutation); any
other value shuffles fully (the buffer size is irrelevant here).

A leaf may be a `windows.Windows` instead of an array: rows that are
windows of a resident 1-D stream, gathered with each batch (every offset
of a text for the price of the text). Everything above holds for it
unchanged: it is only another way to read row i.
"""

import functools

import numpy as np
import tensorflow as tf

from looper import autograph
from looper.data import windows
from looper.errors import ConfigError

_SEED_MOD = 2**31 - 1  # stateless seeds are int64; keep them small and fixed


def is_arrays(value) -> bool:
  """True for (inputs, label) or (inputs, label, sample_weight) whose
  leaves are all numpy arrays or `windows.Windows`."""
  return (isinstance(value, tuple) and len(value) in (2, 3) and
          all(isinstance(leaf, (np.ndarray, windows.Windows))
              for leaf in tf.nest.flatten(value)))


class Arrays:
  """(inputs, label[, sample_weight]) numpy arrays or `windows.Windows`
  (nests of them) sharing their first dimension."""
  mode = "array"

  def __init__(self, arrays, split: str):
    self.split = split
    leaves = tf.nest.flatten(arrays)
    sizes = {len(a) if a.ndim else None for a in leaves}
    if len(sizes) != 1 or None in sizes:
      raise ConfigError(
          f"config.dataset_fn returned arrays for split {split!r} whose first"
          f" dimensions differ ({sorted(map(str, sizes))}); return (inputs,"
          " label) arrays with one row per example")
    self.arrays = arrays
    self.size = sizes.pop()
    self._tensor_cache = None

  def examples(self) -> tf.data.Dataset:
    """One pass in the arrays' order (probes, specs, a shard writer)."""
    tensors = self._tensors()
    return tf.data.Dataset.range(self.size).map(
        autograph.plain(lambda i: _gather(tensors, i)))

  def check(self, replicas: int, batch_size: int, field: str) -> None:
    """Array mode fits any replica count that divides the batch."""

  def train(self, ctx: tf.distribute.InputContext, *, batch_size: int,
            seed: int, shuffle_buffer: int, position: int) -> tf.data.Dataset:
    """This pipeline's endless per-replica train batches from `position`."""
    n, tensors = self.size, self._tensors()
    per_replica = ctx.get_per_replica_batch_size(batch_size)

    @autograph.plain
    def gather(start):
      j = start + tf.range(per_replica, dtype=tf.int64)
      j = _permuted(j, n, seed) if shuffle_buffer else j % n
      return _gather(tensors, j)

    steps = tf.data.Dataset.range(position // batch_size, 2**62)
    return _per_replica_starts(steps, ctx, batch_size).map(
        gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
            tf.data.AUTOTUNE)

  def eval(self, ctx: tf.distribute.InputContext, *, batch_size: int,
           count: int, steps: int) -> tf.data.Dataset:
    """`steps` per-replica eval batches: the first `count` examples, masked."""
    tensors = self._tensors()
    per_replica = ctx.get_per_replica_batch_size(batch_size)

    @autograph.plain
    def gather(start):
      j = start + tf.range(per_replica, dtype=tf.int64)
      mask = tf.cast(j < count, tf.float32)
      example = _gather(tensors, tf.minimum(j, count - 1))
      # Padding repeats a real example; the mask zeroes its weight.
      return (*example, mask)

    return _per_replica_starts(tf.data.Dataset.range(steps), ctx,
                               batch_size).map(gather).prefetch(
                                   tf.data.AUTOTUNE)

  def _tensors(self):
    """The arrays as tensors; a Windows as its rows' gather function."""
    # Converted once (a copy of the arrays: ~0.3 s for the full
    # Fashion-MNIST) and captured by every pipeline's map function by
    # reference (a constant inside the function would copy the arrays into
    # every graph). On the host: the pipelines run there.
    if self._tensor_cache is None:
      streams = {}  # id of a Windows' stream -> its one tensor

      def convert(leaf):
        if not isinstance(leaf, windows.Windows):
          return tf.convert_to_tensor(leaf)
        if id(leaf.stream) not in streams:  # self.arrays keeps it alive
          streams[id(leaf.stream)] = tf.convert_to_tensor(leaf.stream)
        return functools.partial(leaf.gather, streams[id(leaf.stream)])

      # init_scope: eager tensors even if first asked for while tracing.
      with tf.init_scope(), tf.device("CPU:0"):
        self._tensor_cache = tf.nest.map_structure(convert, self.arrays)
    return self._tensor_cache


def _gather(tensors, indices):
  """Rows `indices` of each leaf of `_tensors()`."""
  return tf.nest.map_structure(
      lambda t: t(indices) if callable(t) else tf.gather(t, indices),
      tensors)


def _per_replica_starts(steps: tf.data.Dataset,
                        ctx: tf.distribute.InputContext,
                        batch_size: int) -> tf.data.Dataset:
  """Stream position of each per-replica batch this pipeline feeds.

  Global batch k is positions [kB, (k+1)B); this pipeline's L local
  replicas are global replicas p*L .. p*L+L-1, each taking B/R in turn.
  """
  per_replica = ctx.get_per_replica_batch_size(batch_size)
  local = ctx.num_replicas_in_sync // ctx.num_input_pipelines
  first = ctx.input_pipeline_id * local
  offsets = (first + tf.range(local, dtype=tf.int64)) * per_replica
  # map + unbatch: a flat_map would build a dataset per global batch (3-5%
  # of an MLP step's throughput on 2 cores, measured).
  return steps.map(autograph.plain(
      lambda k: k * batch_size + offsets)).unbatch()


@autograph.plain  # an explicit loop: no AutoGraph rewrite
def _permuted(j, n: int, seed: int):
  """perm_e(j mod n) for e = j // n: a fresh full permutation per epoch.

  index_shuffle takes one seed per call, so the (usually one or two)
  epochs a batch spans are looped over.
  """
  epoch, i = j // n, j % n
  seed = tf.constant(seed % _SEED_MOD, tf.int64)

  def one_epoch(e, out):
    perm = tf.random.experimental.index_shuffle(
        i, tf.stack([seed, e]), tf.constant(n - 1, tf.int64))
    return e + 1, tf.where(epoch == e, perm, out)

  _, out = tf.while_loop(lambda e, _: e <= epoch[-1], one_epoch,
                         (epoch[0], tf.zeros_like(j)))
  return out
