"""A sweep's space, read and checked in a child process (the parent imports no TensorFlow).

Synopsis::

    spec = spec.read("exp.py", ["--config.train.steps=200"], starter, tmp)
    spec["space"], spec["objective"], spec["direction"]   # looper.sweep.space

The child (`python -m looper.cli.sweep_spec --config=exp.py ...`) loads
the experiment as `looper.main` does, calls its `get_sweep()` and prints
the checked sweep after MARK, or ends with one `looper: ...` line.
Loading an experiment imports TensorFlow and Keras (its model_fn's
module), so the parent never does it itself: its memory stays flat over a
study's trials.
"""

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
        [sys.executable, "-m", "looper.cli.sweep_spec", f"--config={config}",
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
