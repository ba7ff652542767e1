"""`python -m looper.cli.shards write`: an experiment's splits as TFRecord shards.

Synopsis::

    python -m looper.cli.shards write --config=experiments/mnist.py \
        --out=/data/mnist [--splits=train,test] [--shard_mb=64]
    # then train from them, any experiment, no code change:
    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/m \
        --config.data.shards_dir=/data/mnist

Each split goes to <out>/<split> with its index.json (`looper.data.shards`
writes and reads them).
"""

import os
import sys

from looper import references
from looper.cli import parsing
from looper.data import shards
from looper.data import splits as splits_lib
from looper.errors import ConfigError


def main(argv):
  """Writes the splits the flags name; exits with one line on a ConfigError."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags
  from ml_collections import config_flags
  config = config_flags.DEFINE_config_file(
      "config", None, "Experiment config file (a .py with get_config()).",
      lock_config=True)
  out = flags.DEFINE_string(
      "out", None, "Directory: each split goes to <out>/<split>; train with"
      " --config.data.shards_dir=<out>.")
  splits = flags.DEFINE_list(
      "splits", None, "Splits to write (default: config.data.train_split"
      " and config.data.eval_split, or each of config.data.eval_splits).")
  shard_mb = flags.DEFINE_float("shard_mb", shards.DEFAULT_SHARD_BYTES / 2**20,
                                "Target size of one shard, in MiB.")
  min_shards = flags.DEFINE_integer(
      "min_shards", shards.DEFAULT_MIN_SHARDS,
      "At least this many shards per split (data.virtual_shards <= it).")
  flags.mark_flags_as_required(["config", "out"])

  def write_splits(args):
    if args[1:] != ["write"]:
      raise app.UsageError("usage: python -m looper.cli.shards write"
                           " --config=FILE --out=DIR [--splits=a,b]")
    try:
      for line in write(config.value, out.value, splits.value,
                        shard_bytes=int(shard_mb.value * 2**20),
                        min_shards=min_shards.value):
        print(line)
    except ConfigError as e:
      sys.exit(f"looper: {e}")

  app.run(write_splits, argv, flags_parser=parsing.parse_flags)


def write(config, out: str, splits=None, **options):
  """Writes each of `splits` (default: the train and eval splits) of
  `config`'s dataset_fn to out/<split>; yields a line per split.
  `options`: `shard_bytes`, `min_shards` of `looper.data.shards.write`."""
  dataset_fn = references.resolve(config.dataset_fn, "dataset_fn")
  default = [config.data.train_split, *splits_lib.eval_sets(config).values()]
  for split in splits or dict.fromkeys(default):
    directory = os.path.join(out, split)
    index = shards.write(shards.as_dataset(dataset_fn(config, split), split),
                         directory, **options)
    yield (f"{directory}: {index['examples']} examples in"
           f" {len(index['files'])} shards")


if __name__ == "__main__":
  main(sys.argv)
