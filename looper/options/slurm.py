"""One multi-worker run from a Slurm job step: each task's TF_CONFIG and GPUs.

Synopsis::

    srun --ntasks=2 python -m looper.main --config=... --workdir=...
    # in each task, before TensorFlow starts (distribute.strategy_for):
    sharing = slurm.join_step(config.distribution.strategy)

In a step of several tasks (SLURM_STEP_NUM_TASKS > 1) with no TF_CONFIG,
each task sets the TF_CONFIG of one worker cluster, the cluster `looper
launch` gives its workers: worker i is Slurm's task i (SLURM_PROCID) at its
node's name (SLURM_STEP_NODELIST, expanded by `scontrol show hostnames`:
TensorFlow's parser rejects lists such as `rack[1-2]n[1-2]`), the tasks of
a node on consecutive ports (`ports`):
- SLURM_STEP_RESV_PORTS where Slurm reserved them (`srun --resv-ports`,
  slurm.conf `MpiParams=ports=12000-12999`): Slurm gives no two steps on a
  node the same ports;
- else PORTS ports from 16384 + PORTS * ((SLURM_JOB_ID + 31 * SLURM_STEP_ID)
  mod 1024), below Linux's ephemeral ports (32768-60999, which outgoing
  connections take): two steps of one job never get the same ones, steps of
  two jobs on one node only when JOB_ID + 31 * STEP_ID agree mod 1024, and
  then the second finds its port taken and stops in one line.
Ranks lie on the nodes in block order (Slurm's default distribution); a
task placed otherwise (srun --distribution=cyclic) stops in one line.

GPUs: where Slurm bound them per task (--gpus-per-task) a task keeps its
CUDA_VISIBLE_DEVICES; where the node's tasks see the same GPUs (--gres=gpu:G)
and their count divides G, each takes its share by SLURM_LOCALID, as `looper
launch` deals them out (`gpu_share`); otherwise the tasks share the node's
GPUs (the returned count), and distribute makes their all-reduce ring.

Why not TensorFlow's SlurmClusterResolver (read in TensorFlow 2.21): on a
node without GPUs it runs nvidia-smi (FileNotFoundError) or, told
gpus_per_node=0, fails in range() (step 0); every step's first task on a
node takes port 8888, so two jobs on a node collide; and it lists nodes
by sorted() name while Slurm ranks them in node-list order, so nodes n9
and n10 get task 0 at n10 (tests/unit/options/test_distribute.py shows each).

No TensorFlow here: `looper launch` uses `gpu_share` and stays light.
"""

import dataclasses
import itertools
import json
import os
import socket
import subprocess

from absl import logging

from looper.errors import ConfigError

PORTS = 16  # per node and step under looper's own port rule
_FIRST_PORT, _BLOCKS = 16384, 1024  # 16384 + 16 * 1024: the ephemeral ports


def listed_gpus(listed: str) -> list[str]:
  """The GPUs a CUDA_VISIBLE_DEVICES value names, as CUDA reads it: up to
  the first negative entry ('' or '-1' is none)."""
  return list(itertools.takewhile(
      lambda d: d and not d.startswith("-"),
      (d.strip() for d in listed.split(","))))


def gpu_share(gpus: list[str], workers: int, index: int) -> list[str] | None:
  """Worker `index`'s GPUs when `workers` workers on one host split `gpus`:
  the index-th len(gpus) / workers of them; None when that is not whole
  (then every worker uses all of them)."""
  share, rest = divmod(len(gpus), workers)
  return None if rest else gpus[index * share:(index + 1) * share]


@dataclasses.dataclass(frozen=True)
class Task:
  """One task of a Slurm step, as its SLURM_* variables describe it."""
  rank: int  # SLURM_PROCID
  local: int  # SLURM_LOCALID: its index among its node's tasks
  node: str  # SLURMD_NODENAME
  nodes: tuple[str, ...]  # the step's nodes, in Slurm's order
  tasks: tuple[int, ...]  # the step's tasks on each of them
  job: int  # SLURM_JOB_ID
  step: int  # SLURM_STEP_ID
  reserved: str  # SLURM_STEP_RESV_PORTS ('' if none)

  @property
  def here(self) -> int:
    """How many of the step's tasks run on this task's node."""
    return self.tasks[self.nodes.index(self.node)]


def hostnames(nodelist: str) -> tuple[str, ...]:
  """A Slurm node list (`n[9-10],gpu3`) as names, by Slurm's own rules."""
  try:
    proc = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                          capture_output=True, text=True, timeout=60,
                          check=False)
    why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  except (OSError, subprocess.SubprocessError) as e:
    proc, why = None, str(e)
  if proc is None or proc.returncode or not proc.stdout.split():
    raise ConfigError(
        f"SLURM_STEP_NODELIST={nodelist!r}: `scontrol show hostnames` failed"
        f" ({why}); run looper where Slurm's scontrol works, or set"
        " TF_CONFIG") from None
  return tuple(proc.stdout.split())


def tasks_per_node(spec: str) -> tuple[int, ...]:
  """SLURM_STEP_TASKS_PER_NODE (`2(x3),1`) as one count per node."""
  counts = []
  for part in spec.split(","):
    count, _, times = part.partition("(x")
    counts += [int(count)] * int(times.rstrip(")") or 1)
  return tuple(counts)


def task(environ=os.environ) -> Task | None:
  """This process's task when it is one of a Slurm step's several tasks
  and TF_CONFIG does not already name a cluster; else None."""
  if environ.get("TF_CONFIG"):
    return None
  if "SLURM_STEP_NUM_TASKS" not in environ:  # not a task srun started
    if int(environ.get("SLURM_NTASKS") or 1) > 1:
      raise ConfigError(
          f"SLURM_NTASKS={environ['SLURM_NTASKS']}: this Slurm job has"
          " several tasks but looper runs as one process outside srun (the"
          " batch script itself); start it with `srun python -m looper.main"
          " ...`, or give the job --ntasks=1")
    return None
  if int(environ["SLURM_STEP_NUM_TASKS"]) < 2:
    return None
  found = Task(
      rank=int(environ["SLURM_PROCID"]), local=int(environ["SLURM_LOCALID"]),
      node=environ["SLURMD_NODENAME"],
      nodes=hostnames(environ["SLURM_STEP_NODELIST"]),
      tasks=tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"]),
      job=int(environ["SLURM_JOB_ID"]), step=int(environ["SLURM_STEP_ID"]),
      reserved=environ.get("SLURM_STEP_RESV_PORTS", ""))
  _check_block_order(found)
  return found


def _check_block_order(t: Task) -> None:
  """Slurm's block distribution: ranks fill the nodes in list order."""
  ends = list(itertools.accumulate(t.tasks))
  index = next(i for i, end in enumerate(ends) if t.rank < end)
  local = t.rank - (ends[index - 1] if index else 0)
  if (t.nodes[index], local) != (t.node, t.local):
    raise ConfigError(
        f"SLURM_PROCID={t.rank} runs on {t.node} as its task {t.local}, but"
        f" looper places rank {t.rank} on {t.nodes[index]} as task {local}"
        " (Slurm's block order); run srun with --distribution=block (the"
        " default)")


def ports(t: Task) -> list[int]:
  """The ports of the step's tasks on each node, its local task i on the
  i-th (see module doc)."""
  if t.reserved:
    reserved = []
    for part in t.reserved.split(","):
      first, _, last = part.partition("-")
      reserved += range(int(first), int(last or first) + 1)
    if len(reserved) < max(t.tasks):
      raise ConfigError(
          f"SLURM_STEP_RESV_PORTS={t.reserved} holds {len(reserved)} ports"
          f" for up to {max(t.tasks)} tasks on a node; run srun with"
          f" --resv-ports={max(t.tasks)}")
    return reserved
  if max(t.tasks) > PORTS:
    raise ConfigError(
        f"{max(t.tasks)} tasks on a node: looper's port rule gives a step"
        f" {PORTS} ports per node; reserve Slurm's own with srun"
        " --resv-ports (slurm.conf MpiParams=ports=12000-12999)")
  first = _FIRST_PORT + PORTS * ((t.job + 31 * t.step) % _BLOCKS)
  return list(range(first, first + PORTS))


def tf_config(t: Task) -> str:
  """The TF_CONFIG of task `t`: worker i is Slurm's rank i."""
  node_ports = ports(t)
  workers = [f"{node}:{port}" for node, count in zip(t.nodes, t.tasks)
             for port in node_ports[:count]]
  return json.dumps({"cluster": {"worker": workers},
                     "task": {"type": "worker", "index": t.rank}})


def _check_port_free(t: Task, port: int) -> None:
  """A port another step holds would fail deep in TensorFlow's start-up."""
  with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("", port))
    except OSError as e:
      raise ConfigError(
          f"port {port} of Slurm step {t.job}.{t.step} (task {t.rank}) is"
          f" taken on {t.node} ({e.strerror}): another job's step got the"
          " same ports; reserve Slurm's own with srun --resv-ports"
          " (slurm.conf MpiParams=ports=12000-12999), or rerun") from None


def join_step(strategy: str, environ=os.environ) -> int:
  """Under a Slurm step of several tasks, sets this task's TF_CONFIG and
  CUDA_VISIBLE_DEVICES in `environ` (see module doc); call it before
  TensorFlow starts on a GPU. Returns how many tasks use the same GPUs of
  this node, if it has any (1: each task its own)."""
  t = task(environ)
  if t is None:
    return 1
  if strategy not in ("auto", "multi_worker"):
    raise ConfigError(
        f"config.distribution.strategy={strategy!r} trains in one process,"
        f" but srun started {sum(t.tasks)} tasks: each would train alone;"
        " set --config.distribution.strategy=auto, or run srun --ntasks=1")
  port = ports(t)[t.local]
  _check_port_free(t, port)
  environ["TF_CONFIG"] = tf_config(t)
  logging.info("Slurm step %d.%d: worker %d at %s:%d (%s)", t.job, t.step,
               t.rank, t.node, port, "ports Slurm reserved" if t.reserved
               else "looper's port rule")
  if t.here == 1 or environ.get("SLURM_GPUS_PER_TASK"):
    return 1  # its own node, or its own GPUs from Slurm
  listed = environ.get("CUDA_VISIBLE_DEVICES")  # Slurm's, with --gres=gpu
  share = None if listed is None else gpu_share(listed_gpus(listed), t.here,
                                                t.local)
  if share is None:  # every GPU of the node (or an uneven split) for each
    return t.here
  if share:
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(share)
  return 1
