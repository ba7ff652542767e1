"""N hosts on one machine: network namespaces on a bridge, a worker in each.

Synopsis::

    with hosts.Hosts(2, tmp_path) as net:     # skips without root or `ip`
      procs = net.start_workers(args)          # one looper worker per host
      net.cut(1)                               # host 1's switch port down
      net.restore(1)                           # ... and up again (a blip)
      logs = net.finish(timeout=60)

Each host is a network namespace with loopback up and one interface,
`eth0`, at 198.18.<id>.<i+1>/24: a range reserved for testing (RFC 2544),
existing only inside these namespaces, so no packet can leave the machine
or reach a real network. The hosts' links meet on a bridge that lives in
a namespace of its own (the switch): cutting a link is bringing its switch
port down, after which the host's packets are dropped silently, as when a
switch port or a VM's NIC dies (not a refused connection, as on loopback).

Namespaces are named `looper-<pid>-...` after the test process; on entry,
those left by a process that is gone (a killed pytest) are deleted first.
On exit every worker is ended by PID and every namespace deleted, however
the test ends. Needs root (with CAP_SYS_ADMIN and CAP_NET_ADMIN) and
iproute2's `ip`; without them `Hosts` skips the test with a one-line
reason; with them, namespaces that cannot be made fail it.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import LOOPBACK_ENV, ROOT, finish, lacks

_PREFIX = "looper-"
_PORT = 7470  # every host listens on the same port: the addresses differ


def _ip(*args: str) -> None:
  proc = subprocess.run(["ip", *args], capture_output=True, text=True,
                        timeout=30, check=False)
  if proc.returncode:
    raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _namespaces() -> list[str]:
  out = subprocess.run(["ip", "netns", "list"], capture_output=True,
                       text=True, timeout=30, check=False).stdout
  return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_orphans() -> None:
  """Deletes namespaces of test processes that no longer exist."""
  for name in _namespaces():
    found = re.fullmatch(rf"{_PREFIX}(\d+)-\w+", name)
    if found and not os.path.exists(f"/proc/{found.group(1)}"):
      _ip("netns", "delete", name)


def why_not() -> str | None:
  """Why namespaces cannot be made here (None: they can)."""
  if shutil.which("ip") is None:
    return "no `ip` (iproute2) on this machine"
  if os.geteuid() != 0:
    return "network namespaces need root"
  missing = lacks("CAP_SYS_ADMIN", "CAP_NET_ADMIN")
  if missing:  # root in a container without them
    return f"network namespaces need {' and '.join(missing)}"
  return None


class Hosts:
  """`n` hosts joined by a bridge; see the module doc."""

  def __init__(self, n: int, logdir, *, subnet: int = 0):
    self.n = n
    self.logdir = pathlib.Path(logdir)
    self._tag = f"{_PREFIX}{os.getpid()}"
    self._subnet = subnet  # 198.18.<subnet>.0/24
    self.switch = f"{self._tag}-sw"
    self.names = [f"{self._tag}-h{i}" for i in range(n)]
    self.procs = []

  def address(self, i: int) -> str:
    return f"198.18.{self._subnet}.{i + 1}"

  def __enter__(self) -> "Hosts":
    reason = why_not()
    if reason:
      pytest.skip(f"hosts: {reason}")
    _delete_orphans()
    try:
      self._make()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
      self._delete()
      # Every prerequisite is here (why_not): a failure, not a skip.
      pytest.fail(f"hosts: could not make the network namespaces ({e})",
                  pytrace=False)
    return self

  def _make(self) -> None:
    _ip("netns", "add", self.switch)
    _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
    _ip("-n", self.switch, "link", "set", "br0", "up")
    for i, name in enumerate(self.names):
      _ip("netns", "add", name)
      _ip("-n", name, "link", "set", "lo", "up")
      # Made in the switch; its peer moves into the host as eth0.
      _ip("-n", self.switch, "link", "add", f"port{i}", "type", "veth",
          "peer", "name", "eth0", "netns", name)
      _ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0")
      _ip("-n", self.switch, "link", "set", f"port{i}", "up")
      _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
      _ip("-n", name, "link", "set", "eth0", "up")

  def _delete(self) -> None:
    for name in [*self.names, self.switch]:
      if name in _namespaces():
        _ip("netns", "delete", name)

  def __exit__(self, *exc) -> None:
    try:
      finish(self.procs, timeout=0)  # killed by PID if still running
    finally:
      self._delete()

  def tf_configs(self) -> list[str]:
    cluster = {"worker": [f"{self.address(i)}:{_PORT}" for i in range(self.n)]}
    return [json.dumps({"cluster": cluster,
                        "task": {"type": "worker", "index": i}})
            for i in range(self.n)]

  def start_workers(self, args) -> list[subprocess.Popen]:
    """`python -m looper.main ARGS` in every host, with TF_CONFIG naming
    the hosts' addresses; each one's stderr in `logdir/host{i}.log`."""
    for i, (name, tf_config) in enumerate(zip(self.names, self.tf_configs())):
      env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CONFIG=tf_config,
                 **LOOPBACK_ENV)
      log_path = self.logdir / f"host{i}.log"
      with open(log_path, "w") as log:
        # `ip netns exec` execs the command: the PID is the worker's.
        proc = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-m",
             "looper.main", *args], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=log)
      proc.log = log_path
      self.procs.append(proc)
    return self.procs

  def cut(self, i: int) -> None:
    """Host i's switch port down: its packets vanish both ways."""
    _ip("-n", self.switch, "link", "set", f"port{i}", "down")

  def restore(self, i: int) -> None:
    _ip("-n", self.switch, "link", "set", f"port{i}", "up")

  def finish(self, timeout: float) -> list[str]:
    """Waits for the workers (killed at `timeout`); returns their logs."""
    return finish(self.procs, timeout)
