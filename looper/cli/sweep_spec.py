"""The child of `looper sweep` that reads the experiment's space (looper.sweep.spec).

Synopsis::

    python -m looper.cli.sweep_spec --config=exp.py --config.train.steps=200
    # prints the checked sweep as one JSON line; or ends with `looper: ...`

It loads the experiment as `looper.main` does (the same parser: an
override naming no field is the same one line), calls the file's
`get_sweep()` (with the `:ARG` of `--config=FILE:ARG`, as get_config) and
checks it against the config with the overrides applied
(looper.sweep.space.check), adding the config's fields the trials'
flags depend on (looper.sweep.trials.CONFIG_READ). Loading an experiment imports TensorFlow and
Keras, which the sweep's own process never does.
"""

import importlib.util
import inspect
import json
import os
import sys

from looper.errors import ConfigError


def load_sweep(path: str, arg: str | None):
  """The file's `get_sweep()` (given `arg` if it takes one); ConfigError
  if it defines none."""
  spec = importlib.util.spec_from_file_location("looper_sweep_experiment",
                                                path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  get_sweep = getattr(module, "get_sweep", None)
  if get_sweep is None:
    raise ConfigError(
        f"--config={path}: the file defines no get_sweep(); define one"
        " returning looper.sweep.Sweep(space=..., objective=...)"
        " (docs/pages/sweeps.md)")
  takes_arg = bool(inspect.signature(get_sweep).parameters)
  return get_sweep(arg) if takes_arg and arg is not None else get_sweep()


def _main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from absl import flags
  from looper.sweep import space
  from looper.sweep import spec
  from looper.sweep import trials
  # pylint: enable=g-import-not-at-top
  value = flags.FLAGS["config"].config_filename
  path, _, arg = value.partition(":")
  try:
    config = flags.FLAGS.config
    checked = space.check(load_sweep(path, arg or None), config)
  except ConfigError as e:
    sys.exit(f"looper: {e}")
  # What the trials' own flags depend on (looper.sweep.trials.study_flags).
  checked.update({k: config[k] for k in trials.CONFIG_READ})
  print(spec.MARK + json.dumps(checked), flush=True)


if __name__ == "__main__":
  # pylint: disable=g-import-not-at-top
  from absl import app
  from ml_collections import config_flags
  from looper.cli import parsing
  # pylint: enable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                  lock_config=True)
  if os.getcwd() not in sys.path:  # as looper.main: the file's own imports
    sys.path.insert(0, os.getcwd())
  app.run(_main, flags_parser=parsing.parse_flags)
