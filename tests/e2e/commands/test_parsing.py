"""looper.cli.parsing through a real `python -m looper.main`: a config
file's own error keeps its traceback, from the file's frame, and the run
ends with looper's line, the last on stderr; a field out of its declared
bounds (checked by the run's validate) is one line. Each other way a
config file fails is checked through the same parser in the test's
process: tests/unit/cli/test_parsing.py.
"""

import pytest

from tests.e2e.commands.test_cli import stderr_lines
from tests.fixtures.processes import run_looper

# Subprocesses (the real command line): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow


_ENV_CONFIG = """\
import os
from tests.fixtures import tiny

def get_config():
  c = tiny.get_config()
  c.data.dir = os.environ["LOOPER_TEST_MISSING_VAR"]
  return c
"""


def test_error_in_get_config_surfaces_with_traceback(tmp_path):
  config = tmp_path / "env_config.py"
  config.write_text(_ENV_CONFIG)
  proc = run_looper(f"--config={config}", f"--workdir={tmp_path}/run",
                    "--config.train.steps=3")
  assert proc.returncode == 1
  assert "the config has no field" not in proc.stderr, proc.stderr[-2000:]
  assert "Traceback (most recent call last):" in proc.stderr
  # The traceback points at the failing line of the config file.
  assert f'File "{config}", line 6, in get_config' in proc.stderr
  assert 'c.data.dir = os.environ["LOOPER_TEST_MISSING_VAR"]' in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      f"looper: --config={config}: loading the config file raised"
      " KeyError('LOOPER_TEST_MISSING_VAR'); see the traceback above")
  assert not (tmp_path / "run").exists()


def test_an_experiment_field_out_of_its_declared_bounds_is_one_line(tmp_path):
  # mnist declares model.width as a whole number >= 2: the override is
  # parsed as an int and checked by validate before a file is written.
  proc = run_looper("--config=experiments/mnist.py:bundled",
                    f"--workdir={tmp_path}/run", "--config.model.width=1")
  assert stderr_lines(proc)[-1] == (
      "looper: config.model.width=1: must be a whole number >= 2; set"
      " --config.model.width")
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "run").exists()
