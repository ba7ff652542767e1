"""looper.cli.parsing: what a config file's own error and an override typo
end in on the command line (the traceback from the file's frame, or one
line)."""

import pytest

from tests.e2e.commands.test_cli import stderr_lines
from tests.fixtures.processes import run_looper

# Subprocesses (the real command line): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow


# --- An error inside the user's get_config() keeps its traceback -----------

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


def test_attribute_error_at_config_module_level_is_not_an_override(tmp_path):
  config = tmp_path / "typo_config.py"
  config.write_text("from looper import config as lc\n"
                    "DEFAULTS = lc.defualt_config()\n"
                    "def get_config():\n  return DEFAULTS\n")
  proc = run_looper(f"--config={config}", f"--workdir={tmp_path}/run")
  assert proc.returncode == 1
  assert "the config has no field" not in proc.stderr
  assert f'File "{config}", line 2, in <module>' in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      f"looper: --config={config}: loading the config file raised"
      " AttributeError(")


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


# --- A config file that does not load ends in one line naming it -----------


def test_config_file_that_does_not_compile_is_one_line(tmp_path):
  """One line (was 56 lines of absl's and importlib's frames), in every
  mode: the file is loaded with the flags, before a mode runs (`check`
  here, which needs no workdir)."""
  config = tmp_path / "bad.py"
  config.write_text("from tests.fixtures import tiny\n\n"
                    "def get_config(:\n"
                    "  return tiny.get_config()\n")
  proc = run_looper(f"--config={config}", f"--workdir={tmp_path}/run",
                    "--mode=check")
  assert stderr_lines(proc) == [
      f"looper: --config={config}: invalid syntax at line 3"
      " (def get_config(:); fix the config file"], proc.stderr[-2000:]
  assert not (tmp_path / "run").exists()


def test_config_file_that_raises_at_import_shows_its_line(tmp_path):
  config = tmp_path / "undefined.py"
  config.write_text("from tests.fixtures import tiny\n"
                    "SIZE = undefined_name\n\n"
                    "def get_config():\n"
                    "  return tiny.get_config()\n")
  lines = stderr_lines(run_looper(f"--config={config}",
                                  f"--workdir={tmp_path}/run"))
  # The traceback starts at the file's own frame: no absl or importlib.
  assert lines[:3] == ["Traceback (most recent call last):",
                       f'  File "{config}", line 2, in <module>',
                       "    SIZE = undefined_name"], lines
  assert lines[-2:] == [
      "NameError: name 'undefined_name' is not defined",
      f"looper: --config={config}: loading the config file raised"
      " NameError(\"name 'undefined_name' is not defined\"); see the"
      " traceback above"]
  assert len(lines) <= 6, lines


def test_config_file_without_a_config_or_missing_is_one_line(tmp_path):
  config = tmp_path / "no_get_config.py"
  config.write_text("from tests.fixtures import tiny\n")
  proc = run_looper(f"--config={config}", f"--workdir={tmp_path}/run")
  assert stderr_lines(proc) == [
      f"looper: --config={config}: the file defines no get_config(); define"
      " get_config() returning the experiment's config, as"
      " experiments/mnist.py does"]
  config.write_text("from tests.fixtures import tiny\n\n"
                    "def get_config():\n"
                    "  c = tiny.get_config()\n")
  proc = run_looper(f"--config={config}", "--mode=describe")
  # Before it, ml_collections' warning (absl's notice, then its line).
  assert stderr_lines(proc)[-1] == (
      f"looper: --config={config}: get_config() returned None; end it with"
      " `return` and the config")
  proc = run_looper(f"--config={tmp_path}/typo.py", "--mode=describe")
  assert stderr_lines(proc) == [
      f"looper: --config={tmp_path}/typo.py: no such file; give the path of"
      " an experiment file, e.g. --config=experiments/mnist.py"]
