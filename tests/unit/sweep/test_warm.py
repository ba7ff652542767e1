"""looper.sweep.warm: a prepared process runs the trial handed to it, as
`python -m looper.main` would; anything else starts afresh."""

import os
import sys

import pytest

from looper import main
from looper.sweep import warm
from tests.fixtures.paths import PYTHONPATH

pytestmark = pytest.mark.slow  # one process imports TensorFlow


def test_a_prepared_process_runs_the_trial_handed_over(tmp_path):
  env = dict(os.environ, PYTHONPATH=PYTHONPATH)
  starter = warm.Warm()
  starter.prepare(env=env)
  prepared = next(iter(starter.ready.values()))
  log = str(tmp_path / "trial.log")
  proc = starter.start([sys.executable, "-m", "looper.main", "--help"],
                       env=env, stdout=log, stderr=log)
  assert proc is prepared and not starter.ready
  assert proc.wait(timeout=120) == 0
  assert open(log).read() == main.USAGE + "\n"
  # Not looper.main: a fresh process, and the prepared one ended.
  starter.prepare(env=env)
  unused = next(iter(starter.ready.values()))
  other = starter.start([sys.executable, "-c", "print('fresh')"], env=env,
                        stdout=log, stderr=log)
  assert other is not unused and other.wait(timeout=60) == 0
  assert unused.poll() is not None
  starter.prepare(env=env)
  left = next(iter(starter.ready.values()))
  starter.close()
  assert left.poll() is not None and not starter.ready
