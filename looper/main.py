"""looper's command line: flags and logging, then one call into `looper.run`.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist \
        --config.train.steps=500 --mode=train_and_eval

This file is intentionally short: everything it does is `run.run(config,
workdir, mode)`, callable from Python with a config from `get_config()`.
Config errors end the program with one line naming the field and the fix.
"""

import os
import sys

# Keep TensorFlow's C++ start-up chatter out of the progress lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
from ml_collections import config_flags

from looper import config as config_lib
from looper import run

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (a .py with get_config()).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, events and config.json.")
_MODE = flags.DEFINE_enum("mode", "train_and_eval", list(run.MODES),
                          "What to run.")
flags.mark_flags_as_required(["config", "workdir"])


def _parse_flags(argv):
  """absl's parser, with config errors shortened to one line."""
  try:
    return flags.FLAGS(argv)
  except config_lib.ConfigError as e:
    sys.exit(f"looper: {e}")
  except (AttributeError, KeyError) as e:  # ml_collections: no such field
    sys.exit(f"looper: {config_lib.override_error(e, argv)}")
  except flags.Error as e:
    sys.exit(f"looper: {e}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.INFO)
  try:
    run.run(_CONFIG.value, _WORKDIR.value, _MODE.value)
  except (config_lib.ConfigError, FloatingPointError) as e:
    sys.exit(f"looper: {e}")


def cli():
  """The `looper` console script."""
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  cli()
