"""`python -m looper.main` and the `looper` script through the real parser.

One real process per kind of exit line: a flag the parser refuses, a config
the run refuses, absl's usage error, a checkpoint the run cannot restore
(in train mode a user's `looper` in a new interpreter, the fresh lane; in
eval mode), the console script. The other cases of a kind
go through the same code in this process: the parser (`parse`,
tests/unit/cli/test_parsing.py) or `looper.run.run`, whose error's text is
the line `python -m looper.main` ends with.
"""

import json
import os
import shutil
import subprocess

from absl import logging as absl_logging
import pytest

from looper import main
from looper import modes
from looper import run
from looper.errors import CheckpointError
from tests.fixtures import tiny
from tests.fixtures.configs import run_here
from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import LOOPBACK_ENV, run_fresh, run_looper
from tests.unit.cli.test_parsing import parse  # pylint: disable=unused-import

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

TINY = "--config=tests/fixtures/tiny.py"


def error_line(proc) -> str:
  """The one line a failed run ends with; no traceback before it."""
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  return proc.stderr.strip().splitlines()[-1]


def test_misspelt_field_suggests_the_right_name(tmp_path):
  # --config PATH, spelt apart; a misspelt section. (A misspelt field
  # through the same parser: unit/config/test_config.py.)
  proc = run_looper("--config", "tests/fixtures/tiny.py",
                    f"--workdir={tmp_path}", "--config.trian.steps=5")
  assert error_line(proc) == ("looper: --config.trian.steps: the config has no"
                              " field 'trian'; did you mean"
                              " --config.train.steps?")


def test_bad_values_fail_in_one_line(tmp_path, parse):  # pylint: disable=redefined-outer-name
  # The parser's line (its process: the misspelt field's).
  try:
    line = parse(TINY, f"--workdir={tmp_path}", "--config.train.steps=abc")[-1]
  finally:  # parsing set absl's --verbosity to its default, WARNING
    absl_logging.set_verbosity(absl_logging.INFO)
  assert line.startswith(
      "looper: flag --config.train.steps=abc: invalid literal for int()")
  proc = run_looper(TINY, f"--workdir={tmp_path}",
                    "--config.train.batch_size=30",
                    "--config.distribution.num_cpu_devices=4")
  assert error_line(proc) == (
      "looper: config.train.batch_size=30 is not divisible by the 4 replicas;"
      " set --config.train.batch_size=32")
  assert not (tmp_path / "checkpoints").exists()


def test_the_mode_flag_names_every_mode_of_a_run():
  # looper.main names them without importing looper.modes (TensorFlow).
  assert main.RUN_MODES == tuple(modes.MODES)


def test_stray_argument_is_a_usage_error(tmp_path):
  proc = run_looper(TINY, f"--workdir={tmp_path}", "extra")
  assert proc.returncode == 1
  assert "unexpected arguments: extra" in proc.stderr


def test_eval_mode_without_checkpoint(tmp_path):
  # The run's CheckpointError, its line after "looper: " (a process ends
  # with one: test_resume_with_a_changed_model_ends_in_looper_line).
  with pytest.raises(CheckpointError) as e:
    run.run(tiny.get_config(), str(tmp_path), "eval")
  assert str(e.value) == (
      f"--mode=eval found no checkpoint in {tmp_path}/checkpoints;"
      " train first, or point --workdir at a trained run")


def test_console_script_runs_an_experiment_that_imports_its_package():
  """The README's quickstart form: `looper MODE --config=experiments/...`
  from the repo root, nothing on PYTHONPATH (experiments/mnist.py imports
  experiments.common, as under `python -m looper.main`)."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  proc = subprocess.run(
      [shutil.which("looper"), "describe",
       "--config=experiments/mnist.py:bundled"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**env, **LOOPBACK_ENV})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert ("  data.eval_split='test[8000:]': 2,000 examples, array mode;"
          in proc.stdout), proc.stdout[-2000:]


def test_console_script_overrides_and_eval_mode(tmp_path):
  script = shutil.which("looper")
  assert script, "no `looper` console script: pip install -e '.[test]'"
  proc = subprocess.run(
      [script, TINY, f"--workdir={tmp_path}", "--config.train.steps=6",
       "--config.train.steps_per_loop=4", "--mode=train"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, **LOOPBACK_ENV))
  assert proc.returncode == 0, proc.stderr[-2000:]
  saved = json.loads((tmp_path / "config.json").read_text())
  assert (saved["train"]["steps"], saved["train"]["steps_per_loop"]) == (6, 4)
  assert len(curve(tmp_path / "train")) == 6
  assert not (tmp_path / "eval").exists()  # train mode: no eval
  record = (tmp_path / "config.json").read_text()
  train_events = sorted((tmp_path / "train").iterdir())
  # An evaluation with its own override must not rewrite the run's record
  # (the same run.run as the command line's, in this process).
  run_here(TINY, f"--workdir={tmp_path}", "--mode=eval",
           "--config.eval.batch_size=32")
  assert scalars(tmp_path / "eval", "examples") == {6: 1001}
  assert (tmp_path / "config.json").read_text() == record
  assert sorted((tmp_path / "train").iterdir()) == train_events


# --- Errors a new user meets: looper's line is the last on stderr -------------


def stderr_lines(proc) -> list[str]:
  """The non-empty lines of a failed run's stderr."""
  assert proc.returncode == 1, proc.stderr[-2000:]
  return [line for line in proc.stderr.splitlines() if line.strip()]


def test_resume_with_a_changed_model_ends_in_looper_line(tmp_path):
  """TensorFlow's "deleted with unrestored values" warnings about the
  failed restore came after looper's line, at exit."""
  run_here(TINY, f"--workdir={tmp_path}", "--config.train.steps=20")
  # train: what TensorFlow prints at a new interpreter's exit, with no
  # TF_CPP_MIN_LOG_LEVEL set beforehand (the fresh lane).
  for mode, start in (("train", run_fresh), ("eval", run_looper)):
    proc = start(TINY, f"--workdir={tmp_path}", f"--mode={mode}",
                 "--config.model.width=32", "--config.train.steps=40")
    assert error_line(proc) == (
        f"looper: {tmp_path}/checkpoints/ckpt-20 holds a different model or"
        " trainer state than the config builds (Received incompatible tensor"
        " with shape (8, 16) when attempting to restore variable with shape"
        " (8, 32) and name sequential/dense/kernel:0.); use a new --workdir,"
        f" or delete {tmp_path} to start over"), (mode, proc.stderr[-2000:])
    assert "WARNING" not in proc.stderr, proc.stderr[-2000:]
