"""tests/fixtures/forks.py: a run forked from the suite's fork server is the
run a fresh `python -m looper.main` makes, and its process a Popen's."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.fixtures import forks
from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV, looper_lines

pytestmark = [pytest.mark.slow,  # looper in processes
              pytest.mark.skipif(os.environ.get("LOOPER_TEST_FORKS") == "0",
                                 reason="LOOPER_TEST_FORKS=0: no forks")]

RUN = [sys.executable, "-m", "looper.main", "--config=tests/fixtures/tiny.py",
       "--config.train.steps=12", "--config.train.steps_per_loop=4",
       "--config.model.dropout=0.3", "--config.model.keras_random=True"]


def _env(**more):
  return dict(os.environ, PYTHONPATH=PYTHONPATH, **LOOPBACK_ENV, **more)


def test_a_forked_run_is_a_fresh_processs_run(tmp_path):
  fresh = subprocess.run([*RUN, f"--workdir={tmp_path}/fresh"], cwd=ROOT,
                         env=_env(), capture_output=True, text=True,
                         timeout=300, check=False)
  forked = forks.popen([*RUN, f"--workdir={tmp_path}/forked"], cwd=ROOT,
                       env=_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  assert isinstance(forked, forks.Forked)
  out, err = forked.communicate(timeout=300)
  assert (fresh.returncode, forked.returncode) == (0, 0), err[-2000:]
  # Dropout draws from Keras' seeded generator: the same numbers, bitwise.
  np.testing.assert_array_equal(curve(tmp_path / "forked" / "train"),
                                curve(tmp_path / "fresh" / "train"))
  assert out == fresh.stdout
  assert (scalars(tmp_path / "forked" / "eval", "loss") ==
          scalars(tmp_path / "fresh" / "eval", "loss"))


def test_exit_codes_signals_and_environment_are_a_processs(tmp_path):
  bad = forks.run([*RUN, "--config.train.steps=-1", f"--workdir={tmp_path}"],
                  cwd=ROOT, env=_env(), timeout=300)
  assert bad.returncode == 1
  assert looper_lines(bad.stderr) == [bad.stderr.splitlines()[-1]]
  assert "train.steps" in bad.stderr.splitlines()[-1]
  code = "import os, sys; print(os.environ['TF_CONFIG'], sys.argv[1:])"
  said = forks.run([sys.executable, "-c", code, "a", "b"], cwd=ROOT,
                   env=_env(TF_CONFIG="{}"), timeout=60)
  assert (said.returncode, said.stdout) == (0, "{} ['a', 'b']\n")
  sleeper = forks.popen([sys.executable, "-c", "import time; time.sleep(60)"],
                        cwd=ROOT, env=_env())
  assert sleeper.poll() is None
  with pytest.raises(subprocess.TimeoutExpired):
    sleeper.wait(timeout=0.1)
  sleeper.kill()
  assert sleeper.wait(timeout=30) == -signal.SIGKILL
  # What a fork would not reproduce (HOME is read at import) is a process.
  other_home = forks.popen([sys.executable, "-c", "pass"], cwd=ROOT,
                           env=_env(HOME=str(tmp_path / "home")))
  assert isinstance(other_home, subprocess.Popen)
  assert other_home.wait(timeout=60) == 0
