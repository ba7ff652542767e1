"""What the experiments shared by copy: the run's cadence, and a split's files.

Synopsis (in an experiment file)::

    from experiments import common

    def get_config():
      c = common.config(model_fn, dataset_fn, steps=2000, batch_size=128,
                        steps_per_loop=100, eval_every=500,
                        eval_batch_size=400, optimizer="adam",
                        learning_rate=1e-3, schedule="cosine")
      ...                             # the experiment's own fields

    field, name = common.split_name(config, split, SPLITS, dataset="MNIST",
                                    sliced="test[:8000]")
    def load_mnist(name, data):       # name: 'train' | 'test' (no slice)
      return common.locate(data, name, SPLITS, _load_from, dataset="MNIST",
                           expected="t10k-images-idx3-ubyte[.gz] ...")

Each experiment file stays the place to read its model, its data and its
numbers (every number is an argument written there); this module only
holds the lines they all repeated.
"""

from typing import Callable

import ml_collections

from looper import config as lc
from looper.data import datasets


def config(model_fn: Callable, dataset_fn: Callable, *, steps: int,
           batch_size: int, steps_per_loop: int, eval_every: int,
           eval_batch_size: int, optimizer: str, learning_rate: float,
           schedule: str, checkpoint_every: int | None = None
           ) -> ml_collections.ConfigDict:
  """`lc.default_config()` with the experiment and its run cadence.

  Args:
    steps, batch_size, steps_per_loop: train.*; batch_size is global.
    eval_every, eval_batch_size: eval.every_steps, eval.batch_size.
    optimizer, learning_rate, schedule: optimizer.name, .learning_rate,
      .schedule.
    checkpoint_every: checkpoint.every_steps (default: eval_every, so every
      evaluated state is saved).
  """
  c = lc.default_config()
  c.model_fn = model_fn
  c.dataset_fn = dataset_fn
  c.train.steps = steps
  c.train.batch_size = batch_size
  c.train.steps_per_loop = steps_per_loop
  c.eval.every_steps = eval_every
  c.eval.batch_size = eval_batch_size
  c.checkpoint.every_steps = checkpoint_every or eval_every
  c.optimizer.name = optimizer
  c.optimizer.learning_rate = learning_rate
  c.optimizer.schedule = schedule
  return c


def split_name(config: ml_collections.ConfigDict, split: str, splits, *,
               dataset: str, sliced: str) -> tuple[str, str]:
  """(the config field naming `split`, its name without the slice).

  Raises:
    ConfigError: a malformed split, or a name `dataset` does not have
      (`sliced` is an example of a slice, for the message).
  """
  field = lc.split_field(config, split)
  name, _, _ = lc.parse_split(split, field)
  if name not in splits:
    raise lc.ConfigError(
        f"config.{field}={split!r}: {dataset} has no split {name!r}; use"
        f" {' or '.join(repr(s) for s in splits)}, optionally sliced like"
        f" {sliced!r}")
  return field, name


def locate(data: ml_collections.ConfigDict, name: str, splits,
           load_from: Callable, *, dataset: str, what: str | None = None,
           **kwargs):
  """Split `name`'s arrays, found by `looper.data.datasets.locate`.

  Args:
    data: the config's `data` block (dir, cache_dir, url, file_hash).
    name: a split name without a slice, one of `splits`.
    splits: the dataset's split names.
    load_from: fn(directory, name, field) -> the arrays, or None if the
      directory does not hold them; `field` is the config field that names
      the directory, for its errors.
    dataset: its name in errors ("MNIST"); `what`: what was not found, if
      more than the dataset ("MNIST 'test'").
    **kwargs: for `datasets.locate` (expected=..., extract=...).

  Raises:
    ConfigError: an unknown name, or what `datasets.locate` raises.
  """
  if name not in splits:
    raise lc.ConfigError(
        f"{dataset} split name {name!r} is unknown; use"
        f" {' or '.join(repr(s) for s in splits)} in"
        " --config.data.train_split / --config.data.eval_split")
  field = "data.dir" if data.get("dir") else "data.cache_dir"
  return datasets.locate(data, what or dataset,
                         lambda directory: load_from(directory, name, field),
                         **kwargs)
