"""A sweep's space, read and checked in a child process (the parent imports no TensorFlow).

Synopsis::

    spec = spec.read("exp.py", ["--config.train.steps=200"], starter, tmp)
    spec["space"], spec["objective"], spec["direction"]   # looper.sweep.space

    python -m looper.sweep.spec --config=exp.py --config.train.steps=200
    # prints the checked sweep as one JSON line; or ends with `looper: ...`

The child loads the experiment as `looper.main` does (the same parser:
an override naming no field is the same one line), calls the file's
`get_sweep()` (with the `:ARG` of `--config=FILE:ARG`, as get_config) and
checks it against the config with the overrides applied
(looper.sweep.space.check). Loading an experiment imports TensorFlow and
Keras (its model_fn's module), so the parent never does it itself: its
memory stays flat over a study's trials.
"""

import importlib.util
import inspect
import json
import os
import sys

from looper.errors import ConfigError

# What the parent reads from the child's stdout: the line after it.
MARK = "looper-sweep-spec:"


def read(config: str, overrides: list[str], starter, folder: str) -> dict:
  """The checked sweep of experiment `config` (module doc), read by a
  child started through `starter` (looper.sweep.trials.Starter) with its
  output in `folder`; ConfigError with the child's one line if it fails."""
  out, err = (os.path.join(folder, f"spec-{os.getpid()}.{name}")
              for name in ("out", "err"))  # one per worker of the folder
  try:
    proc = starter.start(
        [sys.executable, "-m", "looper.sweep.spec", f"--config={config}",
         *overrides], env=dict(os.environ), stdout=out, stderr=err)
    code = proc.wait()
    with open(out) as f:
      lines = [l for l in f.read().splitlines() if l.startswith(MARK)]
    with open(err) as f:
      errors = f.read().splitlines()
  finally:
    for path in (out, err):
      if os.path.exists(path):
        os.remove(path)
  if code == 0 and lines:
    return json.loads(lines[-1][len(MARK):])
  said = [l for l in errors if l.startswith("looper: ")]
  raise ConfigError(said[-1][len("looper: "):] if said else (
      f"reading the sweep of --config={config} ended with status {code}:"
      f" {' | '.join(errors[-3:])}"))


def _get_sweep(path: str, arg: str | None):
  spec = importlib.util.spec_from_file_location("looper_sweep_experiment",
                                                path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  get_sweep = getattr(module, "get_sweep", None)
  if get_sweep is None:
    raise ConfigError(
        f"--config={path}: the file defines no get_sweep(); define one"
        " returning looper.sweep.Sweep(space=..., objective=...) (README"
        " 'Sweeps')")
  takes_arg = bool(inspect.signature(get_sweep).parameters)
  return get_sweep(arg) if takes_arg and arg is not None else get_sweep()


def _main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from absl import flags
  from looper.sweep import space
  # pylint: enable=g-import-not-at-top
  value = flags.FLAGS["config"].config_filename
  path, _, arg = value.partition(":")
  try:
    checked = space.check(_get_sweep(path, arg or None), flags.FLAGS.config)
  except ConfigError as e:
    sys.exit(f"looper: {e}")
  print(MARK + json.dumps(checked), flush=True)


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
