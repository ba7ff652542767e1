"""looper.workdir.lease in-process: who may write a workdir, and when a holder is gone.

The processes' side (two runs on one workdir, a kill -9, readers beside a
writer, a lapsed lease at the next save) is
tests/e2e/restarts/test_workdir_lease.py.
"""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from looper import workdir
from looper.errors import WorkdirError
from looper.workdir import checkpoint
from looper.workdir import holders
from looper.workdir import lease
from tests.fixtures import catalogue


def wd(path) -> workdir.Workdir:
  return workdir.Workdir(str(path))


def lease_file(path) -> pathlib.Path:
  return pathlib.Path(wd(path).lease)


def holder_file(workdir, **fields) -> None:
  record = {"host": "elsewhere", "boot": "b", "pid": 4242, "pid_start": "1",
            "token": "theirs", "since": time.time() - 600,
            "renewed": time.time(), **fields}
  workdir.mkdir(parents=True, exist_ok=True)
  lease_file(workdir).write_text(json.dumps(record))


def read(workdir) -> dict:
  return json.loads(lease_file(workdir).read_text())


def renewed_after(path, when: float, timeout: float = 30) -> bool:
  """Polls the lease file at `path` until its renewal time passes `when`
  (a file replaced whole: a read never sees half of one)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if read(path)["renewed"] > when:
      return True
    time.sleep(0.005)
  return False


def test_a_second_taker_is_refused_naming_the_holder(tmp_path):
  first = lease.Lease.take(wd(tmp_path / "w"), lease_secs=60)
  try:
    held = read(tmp_path / "w")
    assert held["pid"] == first.record["pid"]
    assert held["host"] == socket.gethostname()
    with pytest.raises(WorkdirError) as e:
      lease.Lease.take(wd(tmp_path / "w"), lease_secs=60)
    since = time.strftime("%Y-%m-%d %H:%M:%S",
                          time.localtime(held["since"]))
    assert re.fullmatch(catalogue.line(
        "workdir-held", workdir=tmp_path / "w", host=socket.gethostname(),
        pid=held["pid"], since=since, secs=0, lease=60), str(e.value))
    assert read(tmp_path / "w") == held  # the refused taker wrote nothing
  finally:
    first.release()
  assert not lease_file(tmp_path / "w").exists()
  lease.Lease.take(wd(tmp_path / "w"), lease_secs=60).release()


def test_a_dead_holder_on_this_host_is_stale_at_once(tmp_path):
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  me = holders.me()
  fields = {"host": me["host"], "boot": me["boot"], "pid": proc.pid,
            "pid_start": holders.start_time(proc.pid)}
  holder_file(tmp_path, **fields)
  assert not lease.stale(read(tmp_path), lease_secs=60)
  proc.kill()
  # Ended, not yet reaped (WNOWAIT): a zombie holds nothing.
  os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
  assert lease.stale(read(tmp_path), lease_secs=60)
  proc.wait()
  assert lease.stale(read(tmp_path), lease_secs=60)
  # A live PID that started at another time is a reused PID: stale.
  holder_file(tmp_path, **{**fields, "pid": me["pid"], "pid_start": "7"})
  assert lease.stale(read(tmp_path), lease_secs=60)
  taken = lease.Lease.take(wd(tmp_path), lease_secs=60)
  assert read(tmp_path)["token"] == taken.record["token"]
  taken.release()


def test_another_hosts_holder_is_stale_only_after_lease_secs(tmp_path):
  holder_file(tmp_path, renewed=time.time() - 50)
  with pytest.raises(WorkdirError, match=r"host elsewhere, pid 4242.*renewed"
                     r" 50 s ago"):
    lease.Lease.take(wd(tmp_path), lease_secs=60)
  assert read(tmp_path)["token"] == "theirs"
  holder_file(tmp_path, renewed=time.time() - 61)
  taken = lease.Lease.take(wd(tmp_path), lease_secs=60)
  assert read(tmp_path)["token"] == taken.record["token"] != "theirs"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["lease.json"]
  taken.release()


def test_the_lease_is_renewed_and_a_lapsed_one_is_never_rewritten(tmp_path):
  held = lease.Lease.take(wd(tmp_path), lease_secs=0.4)
  try:
    first = read(tmp_path)["renewed"]
    assert renewed_after(tmp_path, first)  # every 0.1 s
    held.check()  # still ours
    # Another run took it over (this one was cut off for > lease_secs);
    # written just after a renewal, not between its read and its write.
    assert renewed_after(tmp_path, read(tmp_path)["renewed"])
    holder_file(tmp_path, token="theirs", renewed=time.time() - 100)
    # The renewing thread sees it is not ours and ends, writing nothing.
    held._thread.join(timeout=30)  # pylint: disable=protected-access
    assert not held._thread.is_alive()  # pylint: disable=protected-access
    assert read(tmp_path)["token"] == "theirs"
    assert read(tmp_path)["renewed"] < time.time() - 99
    with pytest.raises(WorkdirError, match=(
        r"is now held by host elsewhere pid 4242 since .*: this run's lease"
        r" lapsed \(not renewed for checkpoint.lease_secs=0.4, .*\), so it"
        r" stops without saving")):
      held.check()
  finally:
    held.release()
  assert read(tmp_path)["token"] == "theirs"  # release left it alone


def test_a_checkpointer_guarded_by_a_lapsed_lease_writes_nothing(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  held = lease.Lease.take(wd(tmp_path), lease_secs=60)
  step = tf.Variable(3)
  ckpt = checkpoint.Checkpointer(wd(tmp_path), {"step": step}, keep=3,
                                 chief=True, task_id=0, guard=held.check)
  assert ckpt.save(3) == f"{tmp_path}/checkpoints/ckpt-3"
  holder_file(tmp_path, token="theirs")
  step.assign(4)
  with pytest.raises(WorkdirError):
    ckpt.save(4)
  with pytest.raises(WorkdirError):
    ckpt.save_best(4)
  assert ckpt.all() == [f"{tmp_path}/checkpoints/ckpt-3"]
  assert not (tmp_path / "checkpoints" / "best").exists()
  reader = tf.train.load_checkpoint(ckpt.latest())
  assert np.asarray(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 3
  held.release()


def test_holding_takes_only_when_asked_and_always_releases(tmp_path):
  with lease.holding(wd(tmp_path / "r"), 60, take=False) as held:
    assert held is None
  assert not (tmp_path / "r").exists()  # a reader creates nothing
  with pytest.raises(RuntimeError):
    with lease.holding(wd(tmp_path / "w"), 60, take=True) as held:
      assert read(tmp_path / "w")["token"] == held.record["token"]
      raise RuntimeError("the run failed")
  assert not lease_file(tmp_path / "w").exists()


def test_a_torn_lease_file_holds_nothing(tmp_path):
  lease_file(tmp_path).write_text('{"host": "vm", "pi')
  taken = lease.Lease.take(wd(tmp_path), lease_secs=60)
  assert read(tmp_path)["token"] == taken.record["token"]
  taken.release()
