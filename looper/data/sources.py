"""The input source protocol, and the mode each `dataset_fn` return selects.

Synopsis::

    source = sources.make(split, "data.train_split", config.data,
                          lambda: dataset_fn(config, split))  # a Source
    source.check(replicas, batch_size, "train.batch_size")
    per_replica = source.train(ctx, batch_size=128, seed=0,
                               shuffle_buffer=10_000, position=0)
    masked = source.eval(ctx, batch_size=256, count=n, steps=s)

| dataset_fn returns | mode | each pipeline reads | resume |
|---|---|---|---|
| a tf.data.Dataset | element (`elements`, `buckets`) | the whole stream, keeps its 1/N block | skip within the epoch |
| numpy arrays (inputs, label[, weight]) | array (`arrays`) | only its own examples | O(1) |
| `shards.Files` (or `data.shards_dir` is set) | file (`shards`) | only its own files | skip within each group |

All three are exact on any replica and worker count (the examples of global
batch k do not depend on it); see each module for how. Each is a `Source`,
its `mode` the table's name; FASTER says what speeds each up (and a tf.data
service's, looper.data.service) when a run waits for its input.
Examples of variable length (config.data.bucket) need element mode: only it
pads.
"""

import copy
import os
from typing import Callable, Protocol

import ml_collections
import tensorflow as tf

from looper.data import arrays
from looper.data import buckets
from looper.data import checks
from looper.data import elements
from looper.data import shards
from looper.errors import ConfigError

# What to try, by input mode, when training waits for its batches (the
# train line's input-bound advice: looper.workdir.lines).
FASTER = {
    "element": "element mode: a faster dataset_fn (cache, parallel map;"
               " heavy preprocessing on other machines: data.service), or"
               " array mode (numpy arrays) or file mode (data.shards_dir),"
               " see BUILD.md 'Input modes'",
    "array": "array mode: each batch is gathered from memory; smaller"
             " arrays (uint8 images, scaled in the model) or more host CPUs",
    "file": "file mode: data.cache=True keeps the parsed examples in memory;"
            " or parse on other machines: data.service",
    "service": "data.service: more tf.data service workers (looper"
               " data_service --role=worker)",
}


class Source(Protocol):
  """One split's examples, and the per-replica batches of any input pipeline.

  `train` and `eval` run inside `distribute_datasets_from_function`, once
  per input pipeline (`ctx`); for any topology that `check` accepts, global
  batch k must hold the same examples in the same places.
  """
  split: str  # the split's name, as configured
  size: int | None  # examples in one pass; None: unknown until counted
  mode: str  # 'element', 'array' or 'file' (the table in the module doc)

  def examples(self) -> tf.data.Dataset:
    """One pass over the split as (inputs, label[, weight]) examples, in
    order."""

  def check(self, replicas: int, batch_size: int, field: str) -> None:
    """Raises ConfigError (naming `field`) if the mode cannot feed this
    topology exactly."""

  def train(self, ctx: tf.distribute.InputContext, *, batch_size: int,
            seed: int, shuffle_buffer: int, position: int) -> tf.data.Dataset:
    """This pipeline's endless per-replica batches from global example
    `position` on; epoch e shuffled from (seed, e)."""

  def eval(self, ctx: tf.distribute.InputContext, *, batch_size: int,
           count: int, steps: int) -> tf.data.Dataset:
    """`steps` per-replica batches of (inputs, label, mask): the first
    `count` examples with mask 1, padding with mask 0."""


class Elements:
  """Element mode: any Dataset; all pipelines share one order and each keeps
  its block of every global batch."""
  mode = "element"

  def __init__(self, remake: Callable[[], tf.data.Dataset], split: str,
               bucket: int = 0):
    # Each pipeline builds its own Dataset (on its own host, under its own
    # device scope): the source keeps the function, not a Dataset.
    self.remake, self.split, self.bucket = remake, split, bucket
    self.size = None

  def examples(self) -> tf.data.Dataset:
    return checks.checked(self.remake(), self.split,
                          variable=bool(self.bucket))

  def check(self, replicas: int, batch_size: int, field: str) -> None:
    """Element mode fits any replica count that divides the batch."""

  def train(self, ctx, **kwargs) -> tf.data.Dataset:
    if self.bucket:
      return buckets.train_dataset(self.examples(), ctx, split=self.split,
                                   bucket=self.bucket, **kwargs)
    return elements.train_dataset(self.examples(), ctx, split=self.split,
                                  **kwargs)

  def eval(self, ctx, **kwargs) -> tf.data.Dataset:
    if self.bucket:
      return buckets.eval_dataset(self.examples(), ctx, bucket=self.bucket,
                                  **kwargs)
    return elements.eval_dataset(self.examples(), ctx, **kwargs)


def make(split: str, field: str, options: ml_collections.ConfigDict,
         dataset_fn: Callable[[], object]) -> Source:
  """The source of `split`: what `dataset_fn()` returns, or the shards.

  Args:
    split: the split's name.
    field: the config field naming the split (data.train_split...).
    options: config.data (shards_dir, virtual_shards, cache, bucket).
    dataset_fn: calls the experiment's dataset_fn for `split`; never called
      when options.shards_dir is set (its loader may download), and again
      per pipeline in element mode.

  Raises:
    ConfigError: an unsupported return value, empty or ragged arrays, or
      data.bucket set outside element mode.
  """
  if options.shards_dir:
    value = shards.read(os.path.join(options.shards_dir, split), split)
  else:
    value = dataset_fn()
  if isinstance(value, shards.Files):  # a copy: the caller's stays as it was
    source = copy.copy(value)
    source.split = value.split or split
    source.virtual_shards, source.cache = (options.virtual_shards,
                                           options.cache)
  elif arrays.is_arrays(value):
    source = arrays.Arrays(value, split)
  elif isinstance(value, tf.data.Dataset):
    source = Elements(dataset_fn, split, bucket=options.bucket)
  else:
    raise ConfigError(
        f"config.dataset_fn returned {type(value).__name__} for split"
        f" {split!r}; return a tf.data.Dataset of (inputs, label) examples,"
        " (inputs, label) numpy arrays, or looper.data.shards.Files")
  if options.bucket and not isinstance(source, Elements):
    if options.shards_dir:
      kind, fix = "the files of config.data.shards_dir", "unset it"
    else:
      kind = ("numpy arrays" if isinstance(source, arrays.Arrays)
              else "looper.data.shards.Files")
      fix = "return a tf.data.Dataset from dataset_fn"
    raise ConfigError(
        f"config.data.bucket={options.bucket} pads the variable-length"
        f" examples of a tf.data.Dataset, but split {split!r} comes as"
        f" {kind}; set --config.data.bucket=0 or {fix}")
  if source.size == 0:
    raise checks.empty_split(split, field)
  checks.checked(source.examples(), split, variable=bool(options.bucket))
  return source
