"""looper's command line: flags and logging, then one call into `looper.run`.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist \
        --config.train.steps=500 --mode=train_and_eval

    # Beside it, an evaluator on the same workdir:
    python -m looper.main --config=... --workdir=/tmp/mnist \
        --mode=continuous_eval
    # One checkpoint, once:
    python -m looper.main --config=... --workdir=/tmp/mnist --mode=eval \
        --checkpoint=/tmp/mnist/checkpoints/ckpt-500

This file is intentionally short: everything it does is `run.run(config,
workdir, mode, checkpoint)`, callable from Python with a config from
`get_config()`.
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
import tensorflow as tf

from looper import checkpoint as checkpoint_lib
from looper import config as config_lib
from looper import distribute
from looper import run

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (a .py with get_config()).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, events and config.json.")
_MODE = flags.DEFINE_enum("mode", "train_and_eval", list(run.MODES),
                          "What to run.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None,
    "--mode=eval: the checkpoint prefix to evaluate (default: the latest).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.INFO)
  try:
    run.run(_CONFIG.value, _WORKDIR.value, _MODE.value, _CHECKPOINT.value)
  except (config_lib.ConfigError, checkpoint_lib.CheckpointError,
          FloatingPointError) as e:
    sys.exit(f"looper: {e}")
  except tf.errors.OpError as e:  # a lost or missing worker: one line
    message = distribute.cluster_error(
        e, _CONFIG.value.distribution.worker_timeout_secs)
    if message is None:
      raise
    sys.exit(f"looper: {message}")


def cli():
  """The `looper` console script (`looper launch ...`: see looper.launch)."""
  if sys.argv[1:2] == ["launch"]:
    from looper import launch  # pylint: disable=g-import-not-at-top
    sys.exit(launch.main(sys.argv[2:]))
  app.run(main, flags_parser=config_lib.parse_flags)


if __name__ == "__main__":
  cli()
