"""File mode: TFRecord shards, their index, and an input that reads only its share.

Synopsis::

    # Write an experiment's splits as shards (+ index.json), once
    # (looper.cli.shards):
    python -m looper.cli.shards write --config=experiments/mnist.py --out=/data/mnist
    # Train from them (any experiment, no code change):
    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/m \\
        --config.data.shards_dir=/data/mnist

    # Or from Python / a dataset_fn:
    shards.write(dataset, "/data/mnist/train")      # -> the index
    source = shards.read("/data/mnist/train")       # looper-written shards
    source = shards.Files(["a.tfrecord", ...], parse=my_parse)  # your own

Why groups ("virtual shards"): reading by file scales (each input pipeline
opens only its files), but a pipeline's files depend on how many pipelines
there are, and exactness must not. So the files are dealt into V fixed
groups (file i -> group i mod V). Each group is its own deterministic
stream: epoch e reads the group's files in an order seeded by (seed, group,
e), then a seeded shuffle buffer. Global batch k takes B/V consecutive
examples from every group, so its examples do not depend on the topology;
replica r of R owns groups [r*V/R, (r+1)*V/R) and its pipeline interleaves
only those (in parallel, deterministically). Needs: V <= files, B % V == 0,
V % R == 0. Resume: each group has consumed position/V examples, so it
starts at that epoch and skips within it (record counts come from the
index, never counted twice).

Records hold one example each as a tf.train.Example whose features "0",
"1", ... are `tf.io.serialize_tensor` of the example's leaves: the round trip
is bit-exact for any dtype; index.json keeps the nest structure and specs.
"""

import json
import math
import os
from typing import Callable

import tensorflow as tf

from looper import autograph
from looper.data import arrays
from looper.data import checks
from looper.data import elements
from looper.errors import ConfigError

INDEX = "index.json"
FORMAT = "looper-shards-1"
DEFAULT_SHARD_BYTES = 100 << 20  # ~100 MB per file, as the TPU guides use
DEFAULT_MIN_SHARDS = 64          # enough files for data.virtual_shards=64


# --- Writing ------------------------------------------------------------------

def write(dataset: tf.data.Dataset, directory: str, *,
          shard_bytes: int = DEFAULT_SHARD_BYTES,
          min_shards: int = DEFAULT_MIN_SHARDS) -> dict:
  """Writes (inputs, label[, weight]) examples as TFRecord shards plus
  `index.json`.

  The number of shards is the larger of `min_shards` (at most one per
  example) and what keeps shards near `shard_bytes`, estimated from the
  first examples; shard i holds examples [i*N//S, (i+1)*N//S) in order.
  The index is written last: a directory without one is incomplete.

  Raises:
    ConfigError: `directory` already holds shards.
  """
  dataset = checks.checked(dataset, "write")
  n = checks.num_examples(dataset, "write", field="data")
  if tf.io.gfile.exists(os.path.join(directory, INDEX)):
    raise ConfigError(
        f"{directory} already holds shards ({INDEX}); write to an empty"
        " directory or delete it first")
  tf.io.gfile.makedirs(directory)
  records = map(_record, dataset.map(
      _serialized_leaves, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
          tf.data.AUTOTUNE).as_numpy_iterator())
  sample = [len(_record(leaves)) for leaves in
            dataset.take(100).map(_serialized_leaves).as_numpy_iterator()]
  estimate = n * sum(sample) / len(sample)
  count = max(min(min_shards, n), math.ceil(estimate / shard_bytes))
  files = []
  for i in range(count):
    name = f"shard-{i:05d}-of-{count:05d}.tfrecord"
    size = (i + 1) * n // count - i * n // count
    with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
      for _ in range(size):
        writer.write(next(records))
    files.append([name, size])
  index = dict(format=FORMAT, examples=n, files=files,
               spec=_encode_spec(dataset.element_spec))
  temporary = os.path.join(directory, INDEX + ".tmp")
  with tf.io.gfile.GFile(temporary, "w") as f:
    json.dump(index, f, indent=1)
  tf.io.gfile.rename(temporary, os.path.join(directory, INDEX), overwrite=True)
  return index


@autograph.plain
def _serialized_leaves(*example):
  # In a tf.data map (graph): each leaf's bytes, its dtype and shape kept.
  return tuple(tf.io.serialize_tensor(t) for t in tf.nest.flatten(example))


def _record(leaves) -> bytes:
  return tf.train.Example(features=tf.train.Features(feature={
      str(i): tf.train.Feature(bytes_list=tf.train.BytesList(value=[leaf]))
      for i, leaf in enumerate(leaves)})).SerializeToString()


def _encode_spec(spec):
  """A JSON nest of the element spec: dicts, tuples and TensorSpec leaves."""
  if isinstance(spec, dict):
    return {"dict": {k: _encode_spec(v) for k, v in spec.items()}}
  if isinstance(spec, (tuple, list)):
    return {"tuple": [_encode_spec(v) for v in spec]}
  return {"shape": spec.shape.as_list(), "dtype": spec.dtype.name}


def _decode_spec(encoded):
  if "dict" in encoded:
    return {k: _decode_spec(v) for k, v in encoded["dict"].items()}
  if "tuple" in encoded:
    return tuple(_decode_spec(v) for v in encoded["tuple"])
  return tf.TensorSpec(encoded["shape"], encoded["dtype"])


# --- Reading ------------------------------------------------------------------

def read(directory: str, split: str | None = None) -> "Files":
  """The shards `write` made in `directory`, parsed back bit-for-bit.

  Raises:
    ConfigError: no index (not written by looper, or the write was cut).
  """
  index = _load_index(directory)
  if index is None or index.get("format") != FORMAT:
    raise ConfigError(
        f"{directory} has no complete looper shards (no {INDEX}); write them"
        " with `python -m looper.cli.shards write` or return shards.Files(...,"
        " parse=...) from dataset_fn")
  spec = _decode_spec(index["spec"])
  return Files([os.path.join(directory, name) for name, _ in index["files"]],
               parse=_parser(spec), counts=[c for _, c in index["files"]],
               split=split or directory)


def _load_index(directory: str) -> dict | None:
  path = os.path.join(directory, INDEX)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def _parser(spec) -> Callable[[tf.Tensor], tuple]:
  leaves = tf.nest.flatten(spec)
  features = {str(i): tf.io.FixedLenFeature([], tf.string)
              for i in range(len(leaves))}

  @autograph.plain
  def parse(record):
    raw = tf.io.parse_single_example(record, features)
    return tf.nest.pack_sequence_as(spec, [
        tf.ensure_shape(tf.io.parse_tensor(raw[str(i)], s.dtype), s.shape)
        for i, s in enumerate(leaves)])
  return parse


def count_records(paths) -> list[int]:
  """Records in each TFRecord file (one read of each)."""
  return [int(tf.data.TFRecordDataset(p).reduce(
      tf.constant(0, tf.int64), checks.count)) for p in paths]


class Files:
  """TFRecord files of (inputs, label[, weight]) examples: file mode.

  Args:
    paths: the files, in a fixed order (a glob pattern is expanded, sorted).
    parse: record -> (inputs, label) or (inputs, label, weight).
    counts: records per file; None: read from `index.json` beside the
      files if it lists them, else counted once and written there.
    split: the split's name, for errors.
    virtual_shards, cache: set by the Trainer from config.data.
  """
  mode = "file"

  def __init__(self, paths, parse: Callable, counts=None, split: str = "",
               virtual_shards: int = 64, cache: bool = False):
    if isinstance(paths, str):
      paths = sorted(tf.io.gfile.glob(paths))
    self.paths, self.parse, self.split = list(paths), parse, split
    self.virtual_shards, self.cache = virtual_shards, cache
    self.counts = list(counts) if counts is not None else self._index_counts()
    self.size = sum(self.counts)

  def _index_counts(self) -> list[int]:
    directory = os.path.dirname(self.paths[0]) if self.paths else ""
    index = (_load_index(directory) if directory else None) or {}
    known = dict(index.get("files", []))
    names = [os.path.basename(p) for p in self.paths]
    if all(name in known for name in names):
      return [known[name] for name in names]
    counts = count_records(self.paths)
    index.setdefault("format", "counts")
    index["files"] = sorted({**known, **dict(zip(names, counts))}.items())
    try:  # best effort: a read-only directory just counts again next time
      with tf.io.gfile.GFile(os.path.join(directory, INDEX), "w") as f:
        json.dump(index, f, indent=1)
    except (OSError, tf.errors.OpError):
      pass
    return counts

  def examples(self) -> tf.data.Dataset:
    """One pass over all files in order, parsed (probes, specs, eval)."""
    return tf.data.TFRecordDataset(self.paths).map(
        self.parse, num_parallel_calls=tf.data.AUTOTUNE)

  def check(self, replicas: int, batch_size: int, field: str) -> None:
    """V <= files, B % V == 0, V % replicas == 0: else one line with a V that fits."""
    v, files = self.virtual_shards, len(self.paths)
    fits = lambda u: (u <= files and batch_size % u == 0 and
                      u % replicas == 0)
    if fits(v):
      return
    if v > files:
      why = f"needs at least {v} files, but split {self.split!r} has {files}"
    elif batch_size % v:
      why = (f"does not divide config.{field}={batch_size} (every step"
             " takes as many examples from each group)")
    else:
      why = (f"is not a multiple of the {replicas} replicas (each replica"
             " owns whole groups)")
    good = max((u for u in range(1, files + 1) if fits(u)), default=None)
    fix = (f"set --config.data.virtual_shards={good}" if good else
           f"write more shards or make config.{field} a multiple of"
           f" {replicas}")
    raise ConfigError(f"config.data.virtual_shards={v} {why}; {fix}")

  def groups(self) -> list[list[int]]:
    """File indices of each virtual shard: file i is in group i mod V."""
    return [list(range(g, len(self.paths), self.virtual_shards))
            for g in range(self.virtual_shards)]

  def train(self, ctx: tf.distribute.InputContext, *, batch_size: int,
            seed: int, shuffle_buffer: int, position: int) -> tf.data.Dataset:
    """This pipeline's per-replica batches, reading only its groups' files."""
    v, groups = self.virtual_shards, self.groups()
    mine = v // ctx.num_input_pipelines
    first = ctx.input_pipeline_id * mine
    files = tf.ragged.constant([[self.paths[i] for i in groups[g]]
                                for g in range(first, first + mine)])
    sizes = tf.constant([sum(self.counts[i] for i in groups[g])
                         for g in range(first, first + mine)], tf.int64)
    consumed = position // v  # by every group: B/V per step

    # Converted by AutoGraph (no `autograph.plain`): `self.parse` may be
    # the user's, and a map made where AutoGraph is off never converts it.
    def stream(i):
      """Group first+i's endless stream, `consumed` examples in."""
      paths, n = files[i], sizes[i]
      op_seed = lambda e: e * v + first + i
      cached = (tf.data.TFRecordDataset(paths).map(self.parse).cache()
                if self.cache else None)

      def epoch(e):
        if cached is not None:  # file order fixed: the cache holds one pass
          records = cached
        else:
          if shuffle_buffer:
            paths_e = tf.random.experimental.stateless_shuffle(
                paths, tf.stack([tf.constant(seed, tf.int64), op_seed(e)]))
          else:
            paths_e = paths
          records = tf.data.TFRecordDataset(paths_e).map(self.parse)
        return elements.seeded_shuffle(
            records, tf.minimum(tf.constant(shuffle_buffer, tf.int64), n),
            seed, op_seed(e), enabled=shuffle_buffer > 0)

      return tf.data.Dataset.range(
          consumed // n, elements.INFINITE_EPOCHS).flat_map(epoch).skip(
              consumed % n)

    # B/V examples of each group in turn: a replica's batch is its groups'
    # blocks, in group order. The groups are read in parallel, order kept.
    blocks = tf.data.Dataset.range(mine).interleave(
        stream, cycle_length=mine, block_length=batch_size // v,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return blocks.batch(ctx.get_per_replica_batch_size(batch_size),
                        drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  def eval(self, ctx: tf.distribute.InputContext, *, batch_size: int,
           count: int, steps: int) -> tf.data.Dataset:
    """Eval reads every file, as element mode does (eval splits are small)."""
    return elements.eval_dataset(self.examples(), ctx,
                                 batch_size=batch_size,
                                 count=count, steps=steps)


def as_dataset(value, split: str) -> tf.data.Dataset:
  """What a dataset_fn returned (Dataset, arrays or Files) as one pass."""
  if isinstance(value, Files):
    return value.examples()
  if arrays.is_arrays(value):
    return arrays.Arrays(value, split).examples()  # windows stay virtual
  return checks.checked(value, split)
