"""Multi-worker faults with real processes on 127.0.0.1: no hang, one line.

Two workers of one TF_CONFIG cluster (on CPU each is one replica). A lost
worker and a worker that never comes up must end the others within a
bounded time, naming the task; a stop signal to one worker must stop all
of them at the same step, saved, exit 0.
"""

import re
import signal
import time

import pytest
import tensorflow as tf

from tests.fixtures import catalogue
from tests.fixtures.processes import LOST_WORKER_1, finish, looper_lines
from tests.fixtures.processes import start_workers, wait_for

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

ARGS = ("--config=tests/fixtures/tiny.py", "--config.train.steps_per_loop=50",
        "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0",
        "--config.distribution.worker_timeout_secs=15")


def test_a_lost_worker_ends_the_other_in_one_line(tmp_path):
  procs = start_workers((*ARGS, "--config.train.steps=100000",
                         f"--workdir={tmp_path}/run"), 2, tmp_path)
  try:
    wait_for(procs[0].log, "train step ")  # only the chief logs progress
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    procs[0].wait(timeout=90)
    seconds = time.monotonic() - killed
  finally:
    logs = finish(procs, timeout=10)
  assert procs[0].returncode == 1, logs[0][-3000:]
  # Found by a broken connection or by missed heartbeats, whichever first.
  assert re.fullmatch(LOST_WORKER_1, looper_lines(logs[0])[-1]), (
      logs[0][-3000:])
  assert "Traceback" not in logs[0] and len(looper_lines(logs[0])) == 1
  assert seconds < 60, seconds


def test_a_worker_that_never_comes_up_is_named(tmp_path):
  start = time.monotonic()
  # A short timeout: the wait for the missing worker is the test's length.
  procs = start_workers((*ARGS, "--config.train.steps=10",
                         "--config.distribution.worker_timeout_secs=3",
                         f"--workdir={tmp_path}/run"), 2, tmp_path, only=[0])
  logs = finish(procs, timeout=120)
  assert procs[0].returncode == 1, logs[0][-3000:]
  assert "Traceback" not in logs[0]
  # TensorFlow's C++ shutdown may log after it: the one looper line is it.
  lines = looper_lines(logs[0])
  assert len(lines) == 1 and re.fullmatch(catalogue.looper_line(
      "worker-never-came-up", task="/job:worker/replica:0/task:1", secs=3),
                                          lines[0]), logs[0][-3000:]
  assert time.monotonic() - start < 100


def test_sigterm_to_one_worker_stops_all_at_one_step_and_saves(tmp_path):
  workdir = tmp_path / "run"
  procs = start_workers((*ARGS, "--config.train.steps=100000",
                         f"--workdir={workdir}"), 2, tmp_path)
  try:
    wait_for(procs[0].log, "train step ")
    procs[1].send_signal(signal.SIGTERM)
    for proc in procs:
      proc.wait(timeout=90)
  finally:
    logs = finish(procs, timeout=10)
  assert [p.returncode for p in procs] == [0, 0], logs
  stopped = [l for l in logs[0].splitlines() if "Stopped by" in l]
  assert len(stopped) == 1, logs[0][-3000:]
  step = int(stopped[0].split(" at step ")[1].split(";")[0])
  assert step % 50 == 0  # at a loop boundary, the same on both workers
  assert f"Stopped by SIGTERM at step {step};" in logs[1]
  latest = tf.train.latest_checkpoint(str(workdir / "checkpoints"))
  assert latest == f"{workdir}/checkpoints/ckpt-{step}"
  assert sorted(p.name for p in workdir.iterdir()) == [
      "checkpoints", "config.json", "eval", "goodput", "hparams",
      "metrics.jsonl", "train"]  # no worker scratch
  # One HParams row, the chief's.
  assert len(list((workdir / "hparams").glob("*tfevents*"))) == 1
