"""`python -m looper.launch`: N workers on loopback, all-or-nothing."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import LOOPBACK_ENV, ROOT, curve, run_ok

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

TINY = ("--config=tests/tiny.py", "--config.train.steps_per_loop=10")


def launch(*args, workers=2):
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  env.pop("TF_CONFIG", None)
  return subprocess.Popen(
      [sys.executable, "-m", "looper.launch", f"--workers={workers}", "--",
       *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)


def read_until(proc, text, lines, timeout=120):
  deadline = time.monotonic() + timeout
  for line in proc.stdout:
    lines.append(line)
    if text in line or time.monotonic() > deadline:
      return line
  raise AssertionError("".join(lines[-50:]))


def alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A zombie is dead: its parent (the launcher) has not reaped it yet.
  with open(f"/proc/{pid}/stat") as f:
    return f.read().split(")")[-1].split()[0] != "Z"


def pids(lines):
  return [int(l.split("pid ")[1]) for l in lines if "[launch] worker" in l
          and ": pid " in l]


def test_two_workers_train_like_two_replicas(tmp_path):
  proc = launch(*TINY, "--config.train.steps=20",
                f"--workdir={tmp_path}/launched")
  out = proc.communicate(timeout=300)[0]
  assert proc.returncode == 0, out[-3000:]
  assert "[worker 0] " in out and "[worker 1] " in out
  assert "train step 20/20" in out
  run_ok(*TINY, "--config.train.steps=20",
         "--config.distribution.num_cpu_devices=2",
         f"--workdir={tmp_path}/mirrored")
  np.testing.assert_allclose(curve(tmp_path / "launched" / "train"),
                             curve(tmp_path / "mirrored" / "train"),
                             rtol=1e-5)
  assert sorted(p.name for p in (tmp_path / "launched").iterdir()) == [
      "checkpoints", "config.json", "eval", "hparams", "metrics.jsonl",
      "train"]  # the chief's only


def launch_then(tmp_path, act):
  """A long 2-worker launch; `act(proc, pids)` once training runs.

  Returns (the launcher process, all its output, the worker pids).
  """
  proc = launch(*TINY, "--config.train.steps=100000",
                f"--workdir={tmp_path}/run")
  lines = []
  try:
    read_until(proc, "train step ", lines)
    act(proc, pids(lines))
    out = "".join(lines) + proc.communicate(timeout=120)[0]
  finally:
    proc.kill()
  return proc, out, pids(lines)


def test_a_failing_worker_ends_all_and_is_named(tmp_path):
  proc, out, workers = launch_then(
      tmp_path, lambda proc, pids: os.kill(pids[1], signal.SIGKILL))
  assert proc.returncode == 128 + signal.SIGKILL, out[-3000:]
  assert out.strip().splitlines()[-1] == (
      "[launch] worker 1 failed first (killed by SIGKILL); the others were"
      " ended")
  assert not any(alive(pid) for pid in workers)  # no orphans


def test_sigterm_to_the_launcher_stops_every_worker_saved(tmp_path):
  proc, out, workers = launch_then(
      tmp_path, lambda proc, pids: proc.send_signal(signal.SIGTERM))
  assert proc.returncode == 0, out[-3000:]
  stopped = [l for l in out.splitlines() if "Stopped by SIGTERM" in l]
  assert len(stopped) == 2, out[-3000:]  # both workers, at one step
  assert len({l.split(" at step ")[1].split(";")[0] for l in stopped}) == 1
  assert not any(alive(pid) for pid in workers)


def test_looper_launch_console_script(tmp_path):
  script = shutil.which("looper")
  assert script, "no `looper` console script: pip install -e '.[test]'"
  proc = subprocess.run(
      [script, "launch", "--workers=1", "--", *TINY,
       "--config.train.steps=10", f"--workdir={tmp_path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, **LOOPBACK_ENV))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert "[worker 0] " in proc.stdout and "train step 10/10" in proc.stdout
  assert len(curve(tmp_path / "train")) == 10
