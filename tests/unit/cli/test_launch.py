"""`python -m looper.cli.launch`: N workers on loopback, all-or-nothing, and
their shares of the host's GPUs. Two launched workers training like one
process (their lines, pids and GPUs named, the chief's files only) are
checked in the launch that starts
tests/e2e/multiworker/test_multiworker.py::test_resume_across_topologies."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from looper import network
from looper.cli import launch as launch_lib
from tests.fixtures import forks
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV, fresh_env, looper_script

TINY = ("--config=tests/fixtures/tiny.py", "--config.train.steps_per_loop=10")


def launch(*args, workers=2, reach="private", script=False, **env_vars):
  """`python -m looper.cli.launch` ARGS (`script`: the `looper launch`
  console script, as a user's shell starts it: the fresh lane); its
  workers' reach declared `reach` (the test machines' networks are
  private; None: launch's own, loopback)."""
  env = dict(os.environ, PYTHONPATH=PYTHONPATH, **LOOPBACK_ENV, **env_vars)
  env.pop("TF_CONFIG", None)
  declared = [f"{launch_lib.REACH}={reach}"] if reach else []
  command = [sys.executable, "-m", "looper.cli.launch"]
  if script:
    command, env = [looper_script(), "launch"], fresh_env(**env_vars)
  return forks.popen(
      [*command, f"--workers={workers}", "--", *args, *declared], cwd=ROOT,
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


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
  return [int(l.split("pid ")[1].split(",")[0]) for l in lines
          if "[launch] worker" in l and ": pid " in l]


def launch_then(tmp_path, act, script=False, **env_vars):
  """A long 2-worker launch; `act(proc, pids)` once training runs.

  Returns (the launcher process, all its output, the worker pids).
  """
  proc = launch(*TINY, "--config.train.steps=100000",
                f"--workdir={tmp_path}/run", script=script, **env_vars)
  lines = []
  try:
    read_until(proc, "train step ", lines)
    act(proc, pids(lines))
    out = "".join(lines) + proc.communicate(timeout=120)[0]
  finally:
    proc.kill()
  return proc, out, pids(lines)


def tensorflow_loaded(pid: int) -> bool:
  """Whether the Python process `pid` has TensorFlow's libraries mapped
  (/proc/PID/maps: seen from outside, while it runs)."""
  assert "python" in os.readlink(f"/proc/{pid}/exe")  # not a shell between
  with open(f"/proc/{pid}/maps") as f:
    return f"{os.sep}tensorflow{os.sep}" in f.read()


@pytest.mark.slow  # workers
def test_a_failing_worker_ends_all_and_is_named(tmp_path):
  # Through the `looper launch` console script, which dispatches before
  # importing TensorFlow: not in the launcher while its workers train.
  seen = {}

  def look_then_kill(proc, pids):
    seen.update(launcher=tensorflow_loaded(proc.pid),
                worker=tensorflow_loaded(pids[1]))
    os.kill(pids[1], signal.SIGKILL)

  proc, out, workers = launch_then(tmp_path, look_then_kill, script=True)
  assert seen == {"launcher": False, "worker": True}
  assert proc.returncode == 128 + signal.SIGKILL, out[-3000:]
  assert out.strip().splitlines()[-1] == (
      "[launch] worker 1 failed first (killed by SIGKILL); the others were"
      " ended")
  assert not any(alive(pid) for pid in workers)  # no orphans


@pytest.mark.slow  # workers
def test_sigterm_to_the_launcher_stops_every_worker_saved(tmp_path):
  # One GPU for two workers: they share it, and train over ring all-reduce.
  proc, out, workers = launch_then(
      tmp_path, lambda proc, pids: proc.send_signal(signal.SIGTERM),
      CUDA_VISIBLE_DEVICES="4")
  assert proc.returncode == 0, out[-3000:]
  assert out.startswith("[launch] 1 GPU (4) over 2 workers is not an even"
                        " split: every worker uses all of them")
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert config["distribution"]["all_reduce"] == "ring"
  stopped = [l for l in out.splitlines() if "Stopped by SIGTERM" in l]
  assert len(stopped) == 2, out[-3000:]  # both workers, at one step
  assert len({l.split(" at step ")[1].split(";")[0] for l in stopped}) == 1
  assert not any(alive(pid) for pid in workers)


@pytest.mark.parametrize("args, added", [
    (list(TINY), ["--config.distribution.network=loopback"]),
    ([*TINY, "--config.distribution.network=private"], []),
    ([*TINY, "--config.distribution.network", "public"], []),
])
def test_the_workers_are_declared_loopback_unless_the_flags_say(args, added):
  assert launch_lib.reach_args(args) == added


@pytest.mark.slow  # workers
def test_by_default_the_workers_start_only_where_loopback_is_all(tmp_path):
  # Launch's own reach, loopback, against this machine's real addresses;
  # each address class has its unit test (tests/test_network.py).
  refused = network.refusal(
      "loopback", network.addresses(),
      declared="config.distribution.network='loopback'",
      flag="--config.distribution.network")
  proc = launch(*TINY, "--config.train.steps=10", f"--workdir={tmp_path}",
                reach=None)
  out = proc.communicate(timeout=300)[0]
  if refused is None:  # loopback alone (a namespace, the offline check)
    assert proc.returncode == 0, out[-3000:]
    return
  # Other addresses (this machine's LAN): one line, before any server.
  assert proc.returncode == 1, out[-3000:]
  said = [l.split("] ", 1)[1] for l in out.splitlines()
          if l.startswith("[worker ") and "] looper: " in l]
  assert said and set(said) == {f"looper: {refused}"}, out[-3000:]
  assert re.fullmatch(r"\[launch\] worker \d failed first \(exit 1\); the"
                      r" others were ended", out.strip().splitlines()[-1])
  assert not any(tmp_path.iterdir())  # nothing written


GPUS = "CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize("workers,gpus,envs", [
    (2, [str(i) for i in range(8)], [{GPUS: "0,1,2,3"}, {GPUS: "4,5,6,7"}]),
    (4, ["3", "5", "6", "7"], [{GPUS: "3"}, {GPUS: "5"}, {GPUS: "6"},
                               {GPUS: "7"}]),
    (2, ["GPU-a1", "GPU-b2"], [{GPUS: "GPU-a1"}, {GPUS: "GPU-b2"}]),
    (1, ["0", "1"], [{GPUS: "0,1"}]),
    (2, [], [{}, {}]),  # no GPU: the environment as it is
])
def test_each_worker_gets_its_own_share_of_the_gpus(workers, gpus, envs):
  assert launch_lib.gpu_shares(workers, gpus) == launch_lib.GpuShares(
      envs, [], None)


@pytest.mark.parametrize("workers,gpus,note", [
    (2, ["0", "1", "2"], "[launch] 3 GPUs (0,1,2) over 2 workers is not an"
     " even split: every worker uses all of them (memory grows as needed;"
     " ring all-reduce, as NCCL refuses two workers on one GPU); for one"
     " share each, give a --workers that divides 3"),
    (4, ["7"], "[launch] 1 GPU (7) over 4 workers is not an even split: every"
     " worker uses all of them (memory grows as needed; ring all-reduce, as"
     " NCCL refuses two workers on one GPU); for one share each, give a"
     " --workers that divides 1"),
])
def test_gpus_that_do_not_split_are_shared_over_ring(workers, gpus, note):
  assert launch_lib.gpu_shares(workers, gpus) == launch_lib.GpuShares(
      [{}] * workers, ["--config.distribution.all_reduce=ring"], note)


@pytest.mark.parametrize("listed,gpus", [
    ("2,5", ["2", "5"]),
    (" GPU-a1, GPU-b2", ["GPU-a1", "GPU-b2"]),
    ("0,1,-1,2", ["0", "1"]),  # CUDA stops at the first invalid entry
    ("-1", []),
    ("", []),
])
def test_the_users_cuda_visible_devices_are_the_gpus(monkeypatch, listed,
                                                     gpus):
  monkeypatch.setenv(GPUS, listed)
  assert launch_lib.visible_gpus() == gpus


@pytest.mark.parametrize("script,gpus", [
    ("echo 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-a1)'\n"
     "echo 'GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-b2)'\n"
     "echo '  MIG 1g.5gb Device 0: (UUID: MIG-c3)'", ["0", "1"]),
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the"
     " NVIDIA driver.'; exit 9", []),
    (None, []),  # no nvidia-smi on PATH
])
def test_without_cuda_visible_devices_nvidia_smi_counts(monkeypatch, tmp_path,
                                                        script, gpus):
  if script is not None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 2\n{script}\n")
    smi.chmod(0o755)
  monkeypatch.delenv(GPUS, raising=False)
  monkeypatch.setenv("PATH", str(tmp_path))
  assert launch_lib.visible_gpus() == gpus
