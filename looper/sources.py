"""What `dataset_fn` may return, and the input mode each one selects.

Synopsis::

    source = sources.make(split, "data.train_split", config.data,
                          lambda: dataset_fn(config, split))
    source.check(replicas, global_batch_size, "train.batch_size")
    per_replica = source.train(ctx, global_batch_size=128, seed=0,
                               shuffle_buffer=10_000, position=0)
    masked = source.eval(ctx, global_batch_size=256, count=n, steps=s)

| dataset_fn returns | mode | each pipeline reads | resume |
|---|---|---|---|
| a tf.data.Dataset | element (`data`) | the whole stream, keeps its 1/N block | skip within the epoch |
| numpy arrays (inputs, label) | array (`arrays`) | only its own examples | O(1) |
| `shards.Files` (or `data.shards_dir` is set) | file (`shards`) | only its own files | skip within each group |

All three are exact on any replica and worker count (the examples of global
batch k do not depend on it); see each module for how. Every source has
`split`, `size` (None: unknown until counted), `examples()` (one pass, in
order), `check`, `train` and `eval`. Examples of variable length
(config.data.bucket) need element mode: only it pads.
"""

import copy
import os
from typing import Callable

import ml_collections
import tensorflow as tf

from looper import arrays
from looper import data
from looper import shards
from looper.config import ConfigError


class Elements:
  """Element mode: any Dataset; all pipelines share one order and each keeps
  its block of every global batch."""

  def __init__(self, remake: Callable[[], tf.data.Dataset], split: str,
               bucket: int = 0):
    # Each pipeline builds its own Dataset (on its own host, under its own
    # device scope): the source keeps the function, not a Dataset.
    self.remake, self.split, self.bucket = remake, split, bucket
    self.size = None

  def examples(self) -> tf.data.Dataset:
    return data.checked(self.remake(), self.split, variable=bool(self.bucket))

  def check(self, replicas: int, global_batch_size: int, field: str) -> None:
    """Element mode fits any replica count that divides the batch."""

  def train(self, ctx, **kwargs) -> tf.data.Dataset:
    return data.train_dataset(self.examples(), ctx, split=self.split,
                              bucket=self.bucket, **kwargs)

  def eval(self, ctx, **kwargs) -> tf.data.Dataset:
    return data.eval_dataset(self.examples(), ctx, bucket=self.bucket,
                             **kwargs)


def make(split: str, field: str, options: ml_collections.ConfigDict,
         dataset_fn: Callable[[], object]):
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
        " (inputs, label) numpy arrays, or looper.shards.Files")
  if options.bucket and not isinstance(source, Elements):
    if options.shards_dir:
      kind, fix = "the files of config.data.shards_dir", "unset it"
    else:
      kind = ("numpy arrays" if isinstance(source, arrays.Arrays)
              else "looper.shards.Files")
      fix = "return a tf.data.Dataset from dataset_fn"
    raise ConfigError(
        f"config.data.bucket={options.bucket} pads the variable-length"
        f" examples of a tf.data.Dataset, but split {split!r} comes as"
        f" {kind}; set --config.data.bucket=0 or {fix}")
  if source.size == 0:
    raise data.empty_split(split, field)
  data.checked(source.examples(), split, variable=bool(options.bucket))
  return source
