"""looper under a real Slurm: a step's tasks are one multi-worker run.

A one-node cluster (Debian's slurm-wlm 22.05 and munge, installed by
.ci/run) is started for this module in a temporary directory: its own
munge key and socket, slurm.conf, state and spool, on free ports; each
daemon runs under `timeout`, is ended by PID at the end and its directory
deleted. Skipped with one line where it cannot be: not root, the packages
missing, the host's name not resolving; a cluster that does not come up
(the node not idle in 60 s) fails, showing the daemons' logs.
- 2 tasks (looper's port rule) and 3 tasks (ports Slurm reserved) give the
  per-step losses of one process (the test's, one replica);
- a task killed ends the other, in one line naming it;
- a job requeued mid-run (`sbatch --requeue`, `scontrol requeue`: Slurm's
  SIGTERM, every task saves at one step) resumes bit-exactly;
- looper in a 2-task job's batch script, outside srun: one line;
- README's sweep recipe: an array job's tasks are workers of one study
  (a journal file), each trial run once (stub trials);
- node lists expand as scontrol expands them, where TensorFlow's parser
  fails.
"""

import contextlib
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

from looper.cli import launch
from looper.options import slurm as slurm_lib
from tests.fixtures import needs
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.configs import run_here
from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV, LOST_WORKER_1, looper_lines
from tests.fixtures.processes import wait_for

pytestmark = pytest.mark.slow  # daemons, and looper in processes

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("srun", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
# 48 splits over 1, 2 and 3 replicas; 1009 examples is a prime.
ARGS = ("--config=tests/fixtures/tiny.py", "--config.train.batch_size=48",
        "--config.eval.batch_size=48", "--config.model.num_examples=1009",
        "--config.model.dropout=0.3")
SHORT = ("--config.train.steps=20", "--config.train.steps_per_loop=5",
         "--config.checkpoint.every_steps=10", "--config.eval.every_steps=10")
# Seconds on 2 tasks: long enough to stop in the middle.
LONG = ("--config.train.steps=600", "--config.train.steps_per_loop=20",
        "--config.checkpoint.every_steps=100", "--config.eval.every_steps=300")
# The README's sbatch recipe, with this test's flags.
SBATCH = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --overcommit
#SBATCH --requeue
#SBATCH --open-mode=append
srun {python} -m looper.main {flags}
"""

_CONF = """ClusterName=looper
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket,cred_expire={requeue_secs}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MpiParams=ports=12000-12099
ReturnToService=2
SchedulerParameters=sched_interval=1
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""
REQUEUE_SECS = 5  # a requeued job waits this long (cred_expire) to start
START_SECS = 60  # for the node to register (a few seconds when quiet)


def why_not() -> str | None:
  """Why a Slurm cluster cannot run here (None: it can)."""
  if os.geteuid():
    return "needs root (slurmd starts each task as the job's user)"
  missing = [c for c in DAEMONS + COMMANDS if not shutil.which(c)]
  if missing:
    return (f"{', '.join(missing)} not installed (apt-get install slurm-wlm"
            " munge; .ci/run does)")
  try:
    socket.gethostbyname(socket.gethostname())
  except OSError:
    return f"this host's name {socket.gethostname()!r} does not resolve"
  return None


class Cluster:
  """munged, slurmctld and slurmd in `root`, for this test module."""

  def __init__(self, root):
    self.root = root
    self.daemons = []
    self.env = dict(os.environ, PYTHONPATH=PYTHONPATH, **LOOPBACK_ENV,
                    SLURM_CONF=str(root / "slurm.conf"))
    self.env.pop("TF_CONFIG", None)

  def start(self) -> None:
    (self.root / "state").mkdir()
    (self.root / "spool").mkdir()
    key = self.root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (self.root / "slurm.conf").write_text(_CONF.format(
        host=socket.gethostname(), root=self.root, cpus=os.cpu_count(),
        ports=launch.free_ports(2), requeue_secs=REQUEUE_SECS))
    root = self.root
    self._daemon("munged", "-F", f"--key-file={key}",
                 f"--socket={root}/munge.socket",
                 f"--pid-file={root}/munged.pid",
                 f"--log-file={root}/munged.log",
                 f"--seed-file={root}/munged.seed")
    for daemon in ("slurmctld", "slurmd"):
      self._daemon(daemon, "-D", "-f", str(root / "slurm.conf"))
    # Registration takes seconds, more on a loaded machine: a generous
    # deadline, then a failure showing why (prerequisites are in why_not).
    deadline = time.monotonic() + START_SECS
    state = ""
    while time.monotonic() < deadline:
      state = self.run("sinfo", "-h", "-o", "%T").stdout.strip()
      if state == "idle":
        return
      if any(proc.poll() is not None for proc in self.daemons):
        break  # one of them ended: no use waiting
      time.sleep(0.25)
    ended = [f"{name} exited {proc.returncode}" for name, proc in
             zip(DAEMONS, self.daemons) if proc.poll() is not None]
    what = ", ".join(ended) or f"the node not idle within {START_SECS} s"
    pytest.fail(f"slurm: the one-node cluster did not come up ({what}; sinfo"
                f" says {state or 'nothing'}); the daemons' logs:\n"
                f"{self.log_tail()}", pytrace=False)

  def log_tail(self, lines: int = 15) -> str:
    """The last lines of each daemon's log and output."""
    tails = []
    for path in (self.root / f"{d}.{kind}" for d in DAEMONS
                 for kind in ("log", "out")):
      if path.exists():
        text = path.read_text(errors="replace").strip().splitlines()
        tails.append(f"--- {path.name}:\n" + (
            "\n".join(text[-lines:]) or "(empty)"))
    return "\n".join(tails)

  def _daemon(self, name: str, *args: str) -> None:
    with open(self.root / f"{name}.out", "w") as out:
      # `timeout` bounds it should this process die without stopping it.
      self.daemons.append(subprocess.Popen(
          ["timeout", "900", name, *args], stdout=out,
          stderr=subprocess.STDOUT, start_new_session=True))

  def stop(self) -> None:
    """Cancels every job, then ends the daemons (by their process group)."""
    if self.daemons and shutil.which("scancel"):
      self.run("scancel", "--user=root")
      deadline = time.monotonic() + 30
      while self.run("squeue", "-h").stdout.strip():
        if time.monotonic() > deadline:
          break
        time.sleep(0.25)
    for proc in reversed(self.daemons):
      proc.terminate()  # `timeout` passes it on to the daemon
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

  def run(self, *command: str, timeout: float = 60
          ) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, env=self.env, text=True,
                          capture_output=True, timeout=timeout, check=False)

  def srun(self, tasks: int, *args: str, options=()) -> subprocess.Popen:
    """`srun` of `tasks` looper tasks on the node; its output to a file
    (`proc.log`)."""
    log = self.root / f"srun{len(list(self.root.glob('srun*.log')))}.log"
    with open(log, "w") as out:
      proc = subprocess.Popen(
          ["srun", "-N1", f"-n{tasks}", "--overcommit", *options,
           sys.executable, "-m", "looper.main", *args], cwd=ROOT,
          env=self.env, stdout=out, stderr=subprocess.STDOUT)
    proc.log = log
    return proc

  def job_state(self, job: str) -> dict[str, str]:
    """`scontrol show job`'s fields of `job` (JobState, Restarts, ...)."""
    out = self.run("scontrol", "show", "job", "-o", job).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)

  def finish(self, job: str, timeout: float = 120) -> str:
    """Waits for batch job `job` to end (a requeue is not its end);
    returns its final JobState."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      state = self.job_state(job).get("JobState")
      if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        return state
      time.sleep(0.25)
    raise AssertionError(f"job {job} still {state} after {timeout} s")


def finished(proc: subprocess.Popen, timeout: float = 300) -> str:
  """Waits for `proc`, killing it at `timeout` (its returncode says so);
  returns its log."""
  try:
    proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
  return proc.log.read_text()


@contextlib.contextmanager
def running_cluster():
  """A Cluster started in a folder of its own, stopped and removed after.
  munged serves only a socket whose every directory all may enter: not
  pytest's (0700)."""
  root = pathlib.Path(tempfile.mkdtemp(prefix="looper-slurm-"))
  root.chmod(0o755)
  cluster = Cluster(root)
  try:
    cluster.start()
    yield cluster
  finally:
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
  reason = why_not()
  if reason:
    needs.missing(f"slurm: {reason}")
  with running_cluster() as cluster:
    yield cluster


@pytest.fixture(scope="module")
def two_tasks(slurm, tmp_path_factory):
  """The workdir of an uninterrupted LONG run of 2 tasks."""
  workdir = tmp_path_factory.mktemp("two_tasks")
  log = finished(slurm.srun(2, *ARGS, *LONG, f"--workdir={workdir}"))
  assert "looper done: step 600" in log, log[-3000:]
  return workdir


def test_two_tasks_equal_one_process(slurm, two_tasks, tmp_path):
  run_here(*ARGS, *LONG, f"--workdir={tmp_path}")
  np.testing.assert_allclose(curve(two_tasks / "train"),
                             curve(tmp_path / "train"), rtol=1e-5)
  assert scalars(two_tasks / "eval", "examples") == {300: 1009, 600: 1009}


def test_three_tasks_on_reserved_ports_equal_one_process(slurm, tmp_path):
  proc = slurm.srun(3, *ARGS, *SHORT, f"--workdir={tmp_path}/tasks",
                    options=["--resv-ports=3"])
  log = finished(proc)
  assert proc.returncode == 0, log[-3000:]
  # Each task says where it listens: the ports Slurm reserved for the step.
  ports = dict(re.findall(r"worker (\d) at \S+:(\d+) \(ports Slurm"
                         r" reserved\)", log))
  first = int(ports["0"])
  assert ports == {str(i): str(first + i) for i in range(3)}, log[-3000:]
  assert 12000 <= first <= 12097  # slurm.conf's MpiParams=ports
  run_here(*ARGS, *SHORT, f"--workdir={tmp_path}/one")
  np.testing.assert_allclose(curve(tmp_path / "tasks" / "train"),
                             curve(tmp_path / "one" / "train"), rtol=1e-5)
  assert scalars(tmp_path / "tasks" / "eval", "examples") == {
      10: 1009, 20: 1009}


def test_a_killed_task_ends_the_other_in_one_line(slurm, tmp_path):
  # Missed heartbeats bound it where no reset arrives (the other between
  # collectives).
  proc = slurm.srun(2, *ARGS, *LONG, f"--workdir={tmp_path}",
                    "--config.distribution.worker_timeout_secs=15")
  try:
    wait_for(proc.log, "Saved ")
    pids = slurm.run("scontrol", "listpids").stdout
    task1 = next(int(row.split()[0]) for row in pids.splitlines()[1:]
                 if row.split()[4] == "1")
    os.kill(task1, signal.SIGKILL)
    killed = time.monotonic()
  finally:
    log = finished(proc, timeout=90)
  assert proc.returncode == 128 + signal.SIGKILL, (pids, log[-3000:])
  assert time.monotonic() - killed < 60
  # Found by a broken connection or by missed heartbeats, whichever first.
  assert len(looper_lines(log)) == 1 and re.fullmatch(
      LOST_WORKER_1, looper_lines(log)[0]), log[-3000:]
  assert "task 0: Exited with exit code 1" in log


def test_a_requeued_job_resumes_bit_exactly(slurm, two_tasks, tmp_path):
  workdir, out = tmp_path / "run", tmp_path / "job.out"
  (tmp_path / "job.sh").write_text(SBATCH.format(
      python=sys.executable, flags=" ".join((*ARGS, *LONG,
                                             f"--workdir={workdir}"))))
  job = slurm.run("sbatch", "--parsable", f"--output={out}",
                  str(tmp_path / "job.sh")).stdout.strip()
  out.touch()
  wait_for(out, "Saved ")
  assert slurm.run("scontrol", "requeue", job).returncode == 0
  assert slurm.finish(job) == "COMPLETED", out.read_text()[-3000:]
  assert slurm.job_state(job)["Restarts"] == "1"
  log = out.read_text()
  stopped = re.findall(r"Stopped by SIGTERM at step (\d+)", log)
  assert len(stopped) == 2 and len(set(stopped)) == 1, log[-3000:]
  assert f"resumed from {workdir}/checkpoints/ckpt-{stopped[0]}" in log
  np.testing.assert_array_equal(curve(workdir / "train"),
                                curve(two_tasks / "train"))
  state, want = (checkpoint_tensors(f"{w}/checkpoints/ckpt-600")
                 for w in (workdir, two_tasks))
  assert sorted(state) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(state[key], want[key], err_msg=key)
  assert scalars(workdir / "eval", "examples") == {300: 1009, 600: 1009}


def test_looper_outside_srun_in_a_two_task_job_is_one_line(slurm, tmp_path):
  job = slurm.run(
      "sbatch", "--parsable", "--ntasks=2", "--overcommit",
      f"--output={tmp_path}/job.out", f"--wrap={sys.executable} -m"
      f" looper.main {' '.join(ARGS)} --workdir={tmp_path}/run").stdout.strip()
  assert slurm.finish(job) == "FAILED"
  assert looper_lines((tmp_path / "job.out").read_text()) == [
      "looper: SLURM_NTASKS=2: this Slurm job has several tasks but looper"
      " runs as one process outside srun (the batch script itself); start"
      " it with `srun python -m looper.main ...`, or give the job"
      " --ntasks=1"]
  assert not (tmp_path / "run").exists()


def test_node_lists_expand_as_slurm_expands_them(slurm, monkeypatch):
  monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
  assert slurm_lib.hostnames("rack[1-2]n[1-2],gpu[09-10]") == (
      "rack1n1", "rack1n2", "rack2n1", "rack2n2", "gpu09", "gpu10")
  with pytest.raises(ValueError):  # TensorFlow's SlurmClusterResolver's
    slurm_cluster_resolver.expand_hostlist("rack[1-2]n[1-2]")


# README's sweep recipe: each task of an array job is one sweep worker of
# one study (stub trials: tests/fixtures/sweep_stub.py).
SWEEP_ARRAY = """#!/bin/bash
#SBATCH --array=0-1
#SBATCH --requeue
export LOOPER_STUB_SECS=0.3
{python} -m looper.cli.sweep --config=unused.py --workdir={workdir} \\
    --trials=6 --storage={workdir}/study.journal --study=array --seed=0 \\
    --pruner=none --starter=tests.fixtures.sweeps:Stubs
"""


def test_a_sweep_array_job_runs_each_trial_once(slurm, tmp_path):
  workdir = tmp_path / "sweep"
  (tmp_path / "array.sh").write_text(SWEEP_ARRAY.format(
      python=sys.executable, workdir=workdir))
  job = slurm.run("sbatch", "--parsable", f"--output={tmp_path}/task-%a.out",
                  str(tmp_path / "array.sh")).stdout.strip()
  deadline = time.monotonic() + 120
  while slurm.run("squeue", "-h", "-j", job).stdout.strip():
    assert time.monotonic() < deadline, slurm.log_tail()
    time.sleep(0.25)
  started = []
  for task in (0, 1):
    out = (tmp_path / f"task-{task}.out").read_text()
    started.append({l.split("trial ")[1].split(" ")[0]
                    for l in out.splitlines() if " (model.width=" in l})
  assert started[0] and started[1] and not started[0] & started[1], started
  assert sorted(map(int, started[0] | started[1])) == list(range(6))
  for n in range(6):  # each trial ran once
    assert len((workdir / "trials" / str(n) / "runs.log").read_text()
               .split()) == 1
