"""Runs N workers of one multi-worker job on this machine (development, CI).

Synopsis::

    python -m looper.cli.launch --workers=2 -- --config=tests/fixtures/tiny.py \
        --workdir=/tmp/tiny2
    looper launch --workers=2 -- --config=tests/fixtures/tiny.py \
        --workdir=/tmp/tiny2

Each worker is `python -m looper.main <the flags after -->` with a TF_CONFIG
naming all of them on free 127.0.0.1 ports (worker 0 is the chief). Their
output lines are prefixed (`[worker 1] ...`). The launcher returns the
chief's exit code when every worker succeeds; when one fails it ends the
others (by PID), says which failed first, and returns that worker's code.
SIGINT/SIGTERM to the launcher are passed to every worker (they stop after
the step, save and exit 0); a second one kills them at once.

The host's GPUs (`visible_gpus`) are dealt out (`gpu_shares`): with W
workers and G GPUs, W dividing G, worker i gets the i-th G/W of them as its
CUDA_VISIBLE_DEVICES; otherwise every worker uses all of them (memory
growth, ring all-reduce) and a `[launch]` line says so.

Each worker's TensorFlow server listens on every address of the machine,
so the launcher declares them `--config.distribution.network=loopback`
(looper.network) unless the flags after -- set it: on a machine with any
other address they refuse in one line (pass private there if only your own
machines share its networks).

For real clusters set TF_CONFIG per machine yourself
(docs/pages/distributed.md): this launcher only ever uses loopback addresses.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from looper.cli import parsing
from looper.options import slurm

_GRACE_SECS = 30  # after a failure: how long the others get to exit


def free_ports(n: int) -> list[int]:
  """`n` distinct free TCP ports on 127.0.0.1."""
  sockets = [socket.socket() for _ in range(n)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def tf_configs(num_workers: int) -> list[str]:
  """TF_CONFIG of each worker of one loopback cluster."""
  cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(num_workers)]}
  return [json.dumps({"cluster": cluster,
                      "task": {"type": "worker", "index": i}})
          for i in range(num_workers)]


REACH = "--config.distribution.network"


def reach_args(args: list[str]) -> list[str]:
  """The reach the workers get (module doc): loopback, unless the user's
  flags `args` declare one."""
  if any(a == REACH or a.startswith(f"{REACH}=") for a in args):
    return []
  return [f"{REACH}=loopback"]


def visible_gpus() -> list[str]:
  """The host's GPUs as CUDA_VISIBLE_DEVICES names them: its own entries if
  it is set (up to the first negative one, as CUDA reads it: '' or '-1' is
  none), else `nvidia-smi -L`'s indices, else none.

  Neither TensorFlow nor CUDA: the launcher stays a light parent that holds
  no GPU context. nvidia-smi numbers GPUs by PCI bus and CUDA fastest
  first, but both number 0..G-1, so the shares are still disjoint.
  """
  listed = os.environ.get("CUDA_VISIBLE_DEVICES")
  if listed is not None:
    return slurm.listed_gpus(listed)
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return []
  try:
    listing = subprocess.run([smi, "-L"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return []  # no driver answers: TensorFlow would find no GPU either
  return re.findall(r"^GPU (\d+):", listing, re.M)


@dataclasses.dataclass(frozen=True)
class GpuShares:
  envs: list[dict[str, str]]  # what each worker's environment adds
  args: list[str]  # flags every worker gets after the user's
  note: str | None  # the launcher's line about it


def gpu_shares(num_workers: int, gpus: list[str]) -> GpuShares:
  """How `num_workers` workers use the GPUs `gpus` (see module doc).

  Shared GPUs work because each worker's memory grows as needed
  (distribute.grow_gpu_memory); their all-reduce must be ring, since NCCL
  refuses two workers on one GPU.
  """
  shares = [slurm.gpu_share(gpus, num_workers, i) for i in range(num_workers)]
  if None not in shares:
    return GpuShares([{"CUDA_VISIBLE_DEVICES": ",".join(share)} if share
                      else {} for share in shares], [], None)
  return GpuShares(
      [{}] * num_workers, ["--config.distribution.all_reduce=ring"],
      f"[launch] {len(gpus)} GPU{'s' * (len(gpus) > 1)} ({','.join(gpus)})"
      f" over {num_workers} workers is not an even split: every worker uses"
      f" all of them (memory grows as needed; ring all-reduce, as NCCL"
      f" refuses two workers on one GPU); for one share each, give a"
      f" --workers that divides {len(gpus)}")


def _exit_name(code: int) -> str:
  if code < 0:
    return f"killed by {signal.Signals(-code).name}"
  return f"exit {code}"


class Launcher:
  """Starts the workers, relays their output, ends them all together."""

  def __init__(self, num_workers: int, args: list[str], out=sys.stdout):
    self._out = out
    self._lock = threading.Lock()
    self._procs = []
    self._signals = 0
    shares = gpu_shares(num_workers, visible_gpus())
    if shares.note:
      self._say(shares.note)
    ours = [*shares.args, *reach_args(args)]
    for index, tf_config in enumerate(tf_configs(num_workers)):
      env = dict(os.environ, TF_CONFIG=tf_config, **shares.envs[index])
      proc = subprocess.Popen(
          [sys.executable, "-m", "looper.main", *args, *ours], env=env,
          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      self._procs.append(proc)
      gpus = shares.envs[index].get("CUDA_VISIBLE_DEVICES")
      self._say(f"[launch] worker {index}: pid {proc.pid}" +
                (f", CUDA_VISIBLE_DEVICES={gpus}" if gpus else ""))
      threading.Thread(target=self._relay, args=(index, proc),
                       daemon=True).start()

  def _say(self, line: str) -> None:
    with self._lock:
      self._out.write(line + "\n")
      self._out.flush()

  def _relay(self, index: int, proc: subprocess.Popen) -> None:
    for line in proc.stdout:
      self._say(f"[worker {index}] {line.rstrip()}")

  def on_signal(self, signum, frame) -> None:
    """First signal: pass it on (workers save and stop); second: kill."""
    del frame
    self._signals += 1
    for proc in self._procs:
      if proc.poll() is None:
        if self._signals == 1:
          proc.send_signal(signum)
        else:
          proc.kill()

  def wait(self) -> int:
    """Waits for all workers; returns the launcher's exit code."""
    failed = None
    while any(p.poll() is None for p in self._procs):
      if failed is None:
        failed = next((i for i, p in enumerate(self._procs)
                       if p.poll() not in (None, 0)), None)
        if failed is not None:
          self._end_others(failed)
      time.sleep(0.1)
    if failed is None:
      failed = next((i for i, p in enumerate(self._procs) if p.returncode),
                    None)
    if failed is None:
      return self._procs[0].returncode
    code = self._procs[failed].returncode
    self._say(f"[launch] worker {failed} failed first"
              f" ({_exit_name(code)}); the others were ended")
    return code if code > 0 else 128 - code

  def _end_others(self, failed: int) -> None:
    """SIGTERM the other workers; SIGKILL what is left after a grace time."""
    others = [p for i, p in enumerate(self._procs)
              if i != failed and p.poll() is None]
    for proc in others:
      proc.terminate()
    deadline = time.monotonic() + _GRACE_SECS
    for proc in others:
      try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


FLAGS = flags.FlagValues()  # launch's own, apart from looper.main's
flags.DEFINE_integer("workers", None, "how many worker processes (>= 1)",
                     lower_bound=1, flag_values=FLAGS)
flags.mark_flag_as_required("workers", flag_values=FLAGS)
USAGE = ("usage: looper launch --workers=N -- <python -m looper.main flags>"
         "\n(also: python -m looper.cli.launch --workers=N -- ...)")


def main(argv=None) -> int:
  """`looper launch --workers=N -- FLAGS`; returns the exit code."""
  args = parsing.parse_tool_flags(
      argv, FLAGS, USAGE, "give looper's flags after --, e.g. --"
      " --config=... --workdir=...")
  launcher = Launcher(FLAGS.workers, args)
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, launcher.on_signal)
  return launcher.wait()


if __name__ == "__main__":
  sys.exit(main())
