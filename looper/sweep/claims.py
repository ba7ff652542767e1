"""Which sweep worker runs a trial: a claim file in the trial's folder.

Synopsis::

    with claims.locked(sweep_dir):            # one worker at a time
      if claims.free(folder, lease_secs=60):  # none, or its worker is gone
        claim = claims.Claim.take(folder, lease_secs=60, number=3)
    claim.set_process(pid)                    # the trial's process, for kills
    claim.release()                           # the trial's state is told

Optuna 5's own liveness (RDBStorage's heartbeat) exists only on database
storages and only inside `study.optimize()`; a journal file has none. So
looper keeps its own rule on every storage: `DIR/trials/<n>/claim.json`
names the worker running trial n (host, PID, start time, renewed every
quarter of `lease_secs` by a thread), and a worker that finds a RUNNING
trial whose claim is missing or stale (looper.workdir.holders: its PID gone
on this host, not renewed for `lease_secs` from another) takes the trial
over and resumes it from its own checkpoint. Workers share the sweep's
folder (one machine, or a shared file system), and take claims and ask for
trials under one lock file there (`fcntl.flock`), so no two take one trial.
"""

import contextlib
import fcntl
import json
import os
import threading
import time

from looper.workdir import holders

NAME = "claim.json"


@contextlib.contextmanager
def locked(sweep_dir: str):
  """Holds `sweep_dir/sweep.lock` (exclusive) for the block."""
  with open(os.path.join(sweep_dir, "sweep.lock"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def read_json(path: str) -> dict | None:
  """A holder record (a claim, a run's lease.json); None if none."""
  try:
    with open(path) as f:
      return json.loads(f.read())
  except (OSError, ValueError):  # none, or torn by a crash: nobody's
    return None


def free(folder: str, lease_secs: float) -> bool:
  """Whether no live worker claims the trial in `folder`."""
  holder = read_json(os.path.join(folder, NAME))
  return holder is None or holders.stale(holder, lease_secs)


def _write(path: str, record: dict) -> None:
  """Whole or not at all: readers never see half a record."""
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    f.write(json.dumps(record))
  os.replace(tmp, path)


class Claim:
  """This worker's claim on one trial (module doc)."""

  def __init__(self, folder: str, record: dict, lease_secs: float):
    self.path = os.path.join(folder, NAME)
    self.record = record
    self._lease_secs = lease_secs
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._renew, daemon=True,
                                    name="looper-sweep-claim")
    self._thread.start()

  @classmethod
  def take(cls, folder: str, lease_secs: float, number: int) -> "Claim":
    os.makedirs(folder, exist_ok=True)
    now = time.time()
    record = {**holders.me(), "trial": number, "since": now, "renewed": now,
              "process": None}
    _write(os.path.join(folder, NAME), record)
    return cls(folder, record, lease_secs)

  def set_process(self, pid: int | None) -> None:
    """Names the trial's process (tests and people kill it by this)."""
    self.record["process"] = pid
    _write(self.path, self.record)

  def _renew(self) -> None:
    while not self._done.wait(self._lease_secs / 4):
      self.record["renewed"] = time.time()
      try:
        _write(self.path, self.record)
      except OSError:
        pass  # retried at the next renewal

  def release(self) -> None:
    self._done.set()
    self._thread.join()
    with contextlib.suppress(FileNotFoundError):
      os.remove(self.path)
