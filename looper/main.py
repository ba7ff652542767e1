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
    # For serving (workdir/export/<step>), and a TPU preflight on the CPU:
    python -m looper.main --config=... --workdir=/tmp/mnist --mode=export
    looper check --config=experiments/mnist.py --cores=8

This file is intentionally short: everything it does is `run.run(config,
workdir, mode, checkpoint)`, callable from Python with a config from
`get_config()`.
Config errors end the program with one line naming the field and the fix,
the last line on stderr.
"""

import importlib
import os
import sys

# Nothing here imports TensorFlow: `looper launch` and `looper --help` run
# without it; a run mode imports it in `cli`, quietly (console.start), and
# its modules in `main`.
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from looper import console
from looper import errors
from looper.cli import parsing

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (a .py with get_config()).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, events and config.json.")


def _describe(config) -> None:
  from looper.cli import describe  # pylint: disable=g-import-not-at-top
  print(describe.describe(config))


def _check(config) -> None:
  from looper.cli import tpu_check  # pylint: disable=g-import-not-at-top
  notes = []
  problems = tpu_check.check(config, cores=_CORES.value, notes=notes)
  print(tpu_check.report(problems, config, _CORES.value, notes))
  sys.exit(1 if problems else 0)


# looper.modes.MODES' names (test_cli checks them), which need a workdir:
# that module imports TensorFlow, which the flags' definition must not.
RUN_MODES = ("train", "eval", "train_and_eval", "continuous_eval", "export")
# Modes that look at an experiment without a workdir.
_INSPECT_MODES = {"check": _check, "describe": _describe}
_MODE_NAMES = [*RUN_MODES, *_INSPECT_MODES]
_MODE = flags.DEFINE_enum("mode", "train_and_eval", _MODE_NAMES,
                          "What to run (also `looper MODE --config=...`).")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None,
    "--mode=eval/export: the checkpoint prefix to use (default: the latest).")
_CORES = flags.DEFINE_integer(
    "cores", 8, "--mode=check: TPU cores of the target (8: a v3-8 or v4-8).")
flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if logging.get_verbosity() < 1:  # --verbosity >= 1 keeps absl's lines
    logging.set_verbosity(logging.INFO)
    console.short_log_lines()
  inspect = _INSPECT_MODES.get(_MODE.value)
  if inspect is None and not _WORKDIR.value:
    raise app.UsageError(f"--mode={_MODE.value} needs --workdir")
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from looper import run
  from looper.options import cluster
  from looper.measure import goodput
  # pylint: enable=g-import-not-at-top
  try:
    if inspect is not None:
      inspect(_CONFIG.value)
    else:
      # The attempt's goodput counts its start-up from the process' start.
      run.run(_CONFIG.value, _WORKDIR.value, _MODE.value, _CHECKPOINT.value,
              started=goodput.process_started())
  except (errors.ConfigError, errors.CheckpointError, errors.DataError,
          errors.WorkdirError, FloatingPointError) as e:
    _exit(e, str(e))
  except tf.errors.OpError as e:  # a lost or missing worker: one line
    message = errors.cluster_error(
        e, _CONFIG.value.distribution.worker_timeout_secs,
        leader=cluster.coordination_leader())
    if message is None:
      raise
    _exit(e, message)


def _exit(error: BaseException, line: str) -> None:
  """Ends with `line` as the last line on stderr: what TensorFlow logs when
  the failed run's objects are deleted at exit would follow it."""
  console.expect_partial_restores(error)
  sys.exit(f"looper: {line}")


USAGE = """\
usage: looper MODE --config=EXPERIMENT.py [--workdir=DIR] [--config.FIELD=VALUE ...]

modes:
  train_and_eval   train, evaluating every eval.every_steps (the default)
  train            train only
  eval             evaluate the latest checkpoint (or --checkpoint=PREFIX) once
  continuous_eval  evaluate each new checkpoint of a training run beside it
  export           write a checkpoint as a SavedModel for serving
  check            will it compile and feed on a TPU? (--cores=8, no workdir)
  describe         strategy, batch, data, model and config (no workdir)
  launch           N local workers: looper launch --workers=2 -- ARGS
  runs             a table of runs' final metrics: looper runs DIR ...
  sweep            a hyperparameter study, one run per trial (get_sweep):
                   looper sweep --config=EXP.py --workdir=DIR --trials=N
  data_service     a tf.data service server for --config.data.service:
                   looper data_service --role=dispatcher --port=P [--work_dir=D]
                   looper data_service --role=worker --dispatcher=HOST:P --port=Q
                   (--network=private|public where the machine has other
                   addresses than loopback: it listens on all of them)

experiments: experiments/*.py, one file each (mnist, cifar10, imdb_lstm,
text_classifier, tfrecord_images); copy one to start your own.
e.g.  looper train --config=experiments/mnist.py --workdir=/tmp/mnist
All flags: looper --helpfull.  Same as: python -m looper.main --mode=MODE ..."""


def cli():
  """The `looper` console script: `looper MODE --config=...` is
  `python -m looper.main --mode=MODE --config=...`; `looper launch ...`
  starts workers (see looper.cli.launch), `looper runs DIR...` tabulates runs
  (see looper.cli.runs), `looper sweep ...` runs a study of trials (see
  looper.cli.sweep), `looper data_service ...` serves a tf.data service
  (see looper.cli.data_service)."""
  if sys.argv[1:2] in (["launch"], ["runs"], ["data_service"], ["sweep"]):
    # Only the tool asked for (own flags): launch and sweep import no
    # TensorFlow; the others do, quietly as a run does.
    if sys.argv[1] not in ("launch", "sweep"):
      console.start(verbose=console.wants_tensorflow_logs(sys.argv))
    tool = importlib.import_module(f"looper.cli.{sys.argv[1]}")
    sys.exit(tool.main(sys.argv[2:]))
  if sys.argv[1:] in ([], ["--help"], ["-h"], ["help"]):
    print(USAGE)
    sys.exit(0 if sys.argv[1:] else 2)
  if len(sys.argv) > 1 and sys.argv[1] in _MODE_NAMES:
    sys.argv[1:2] = [f"--mode={sys.argv[1]}"]
  # As under `python -m`: the working directory is importable, so a config
  # file's own imports (`from experiments import common`) resolve the same.
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.insert(0, os.getcwd())
  # TensorFlow's C++ start-up lines stay off the first screen unless
  # --verbosity >= 1 (see looper/console.py).
  console.start(verbose=console.wants_tensorflow_logs(sys.argv))
  app.run(main, flags_parser=parsing.parse_flags)


if __name__ == "__main__":
  cli()
