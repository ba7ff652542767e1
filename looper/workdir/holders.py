"""Who holds a file, and whether that holder is provably gone (no TensorFlow).

Synopsis::

    record = {**holders.me(), "renewed": time.time()}   # written in a file
    holders.stale(record, lease_secs=60)   # its process gone (this host),
                                           # or not renewed for 60 s (another)

The liveness rule of the workdir lease (looper.workdir.lease) and of a
sweep's trial claims (looper.sweep.claims), in one place: a sweep's parent
imports no TensorFlow, so this module does not either. A holder on this
host (same host name and boot) is gone once its PID is (or is a zombie, or
a newer process reused the PID), which is known at once after a kill -9; a
holder on another host is gone when it has not renewed its record for
`lease_secs` (a lost VM, whose PID this host cannot see).
"""

import os
import socket
import time


def _boot_id() -> str:
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      return f.read().strip()
  except OSError:
    return ""


def start_time(pid: int) -> str | None:
  """When process `pid` started (clock ticks since boot); None if it is
  gone or a zombie (killed, not yet reaped: it writes nothing more)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return None if fields[0] == "Z" else fields[19]


def me(pid: int | None = None) -> dict:
  """This process (or process `pid` of this host) as a holder record."""
  pid = os.getpid() if pid is None else pid
  return {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid,
          "pid_start": start_time(pid)}


def stale(holder: dict, lease_secs: float, now: float | None = None
          ) -> bool:
  """Whether the holder written in a record is provably gone (module doc:
  its PID on this host, else the renewal time)."""
  here = me()
  if holder.get("host") == here["host"] and holder.get("boot") == here["boot"]:
    return start_time(holder.get("pid", -1)) != holder.get("pid_start")
  now = time.time() if now is None else now
  return now - holder.get("renewed", 0) > lease_secs
