"""The session's hooks and the environment every test process runs in.

The helpers tests import are in tests/fixtures/ (paths, processes, events,
checkpoints, configs, servers, stopping, private_home; the tiny
experiments); the pytest fixtures among them are registered here
(`pytest_plugins`).
"""

import gc
import os
import sys

from absl import logging as absl_logging
import pytest

from tests.fixtures import private_home
from tests.fixtures.configs import SESSION_CPUS
from tests.fixtures.paths import PYTHONPATH
from tests.fixtures.processes import LOOPBACK_ENV

pytest_plugins = ("tests.fixtures.configs", "tests.fixtures.servers",
                  "tests.fixtures.stopping")

# This process too: nothing a test runs in it may leave this machine.
os.environ.update(LOOPBACK_ENV)
# Nothing of looper's (nor Keras' or Matplotlib's) lands in the user's HOME:
# this session and what it starts have their own, checked at its end.
private_home.enter()
# Every process the session starts, those that build their environment from
# this one included, starts as a core install does (paths.PYTHONPATH).
os.environ["PYTHONPATH"] = PYTHONPATH


# Freeing a run's TensorFlow objects (tf.data iterators, traced functions)
# stalls for seconds, in a garbage collection inside a later test or at
# exit (measured, 2-core CPU under load: the fast lane 143 s with
# collection, 90 s without; a test alone 1 s that took 19 s in the lane).
# The test session keeps every object to its end and skips the
# interpreter's teardown, where the same frees would stall: pytest's exit
# status is kept and the process ends there, after every report is written.
_SESSION = {}


def pytest_configure(config):  # pylint: disable=unused-argument
  gc.disable()
  # Two logical CPUs before TensorFlow starts: a run of 2 replicas (the
  # references the contracts compare against) runs in the test's process,
  # not in a new one (~5 CPU-s of start-up each); one replica still runs on
  # the default strategy, on the first of them.
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  distribute.split_cpu(SESSION_CPUS)
  # INFO lines, as looper.main sets them for a run: tests that read them
  # (caplog) must not depend on an earlier test having run looper.main in
  # this process (pytest-xdist deals the files to workers in any order).
  absl_logging.set_verbosity(absl_logging.INFO)


@pytest.fixture(autouse=True)
def _absl_logs_info():
  """Each test starts with absl's INFO lines on, whatever ran before it in
  this worker: saving a SavedModel sets absl's logger to WARNING and leaves
  it there (TensorFlow 2.21), and a test's caplog would then see nothing."""
  absl_logging.set_verbosity(absl_logging.INFO)


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  _SESSION["status"] = int(exitstatus)
  appeared = private_home.leave()
  if appeared:  # a test wrote into `~`: the session fails
    sys.stderr.write(f"\nThe tests wrote into HOME (tests/fixtures/"
                     f"private_home.py): {', '.join(appeared[:20])}\n")
    _SESSION["status"] = session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):  # pylint: disable=unused-argument
  if "status" in _SESSION:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_SESSION["status"])

