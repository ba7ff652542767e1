"""One writer per workdir: the lease a training run holds while it writes.

Synopsis::

    with lease.holding(workdir, lease_secs=60, take=chief) as held:
      ...               # Lease.take raised WorkdirError if another run holds it
      held.check()      # before each save: still ours? (else WorkdirError)
    # released (the file deleted) however the block ends

A training run (its chief, under multi-worker) writes `workdir/lease.json`
(`Workdir.lease`; `workdir` is a looper.workdir.Workdir) before it writes
anything else, saying who holds the workdir: host, PID, since when, and a
token new to this run. A second writer finds the file
and stops at once with one line naming the holder and the fix. Readers
(--mode=eval, continuous_eval, export; describe, runs) never take it.

A holder that died must not block the workdir forever. The file is stale,
and the next run takes it over, when
- the holder ran on this host (same host name and boot) and its PID is gone
  (or is a zombie, or is a newer process that reused the PID), which is
  known at once after a kill -9; or
- the holder ran on another host and has not renewed the lease for
  `checkpoint.lease_secs` (a thread renews it every quarter of that), which
  covers a lost VM, whose PID this host cannot see. Hosts' clocks are
  assumed to agree to well under that time (NTP).
A run whose lease lapsed (its host was cut off for longer than
`lease_secs`, another run took the workdir) finds a token not its own at
its next save, and stops without saving: it never overwrites checkpoints of
the run that replaced it.

On a local disk the file appears whole and only once (`files.create`: a
hard link of a finished file; a stale one is first renamed aside and
checked to be the one judged stale). On an object store (gs://, s3://;
`workdir.posix`) the lease is advisory, and a run says so in one line as
it takes it: there is no exclusive create (a look, then a write) and a
rename is a copy and a delete, so two runs started within seconds of each
other can both take it; the check before each save then stops the one
whose token was overwritten, but both may have written metrics and events
by then.
"""

import contextlib
import datetime
import json
import os
import threading
import time
import uuid

from absl import logging
import tensorflow as tf

from looper import errors
from looper import workdir as workdir_lib
from looper.errors import WorkdirError
from looper.workdir import files
from looper.workdir import holders
from looper.workdir.holders import stale


@contextlib.contextmanager
def holding(workdir: workdir_lib.Workdir, lease_secs: float, *, take: bool):
  """The workdir's Lease for the block, released however it ends; None
  (nothing taken) when not `take`."""
  if not take:
    yield None
    return
  held = Lease.take(workdir, lease_secs)
  try:
    yield held
  finally:
    held.release()


def _since(when: float) -> str:
  return datetime.datetime.fromtimestamp(when).isoformat(
      sep=" ", timespec="seconds")


class Lease:
  """The workdir lease of this run; see the module doc."""

  def __init__(self, workdir: workdir_lib.Workdir, record: dict,
               lease_secs: float):
    self._workdir = workdir.root
    self.path = workdir.lease
    self.record = record
    self._lease_secs = lease_secs
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                    name="looper-lease")
    self._thread.start()

  @classmethod
  def take(cls, workdir: workdir_lib.Workdir, lease_secs: float) -> "Lease":
    """Takes the lease of `workdir` (made if missing), or raises
    WorkdirError naming who holds it."""
    path = workdir.lease
    try:
      files.makedirs(workdir.root)
    except (tf.errors.OpError, OSError) as e:
      raise errors.unwritable_workdir(workdir.root, e) from None
    if not workdir_lib.posix(path):
      logging.info(
          "--workdir=%s is on an object store: its lease is advisory (no"
          " exclusive create there); start one run per workdir (BUILD.md"
          " 'Object storage')", workdir.root)
    now = time.time()
    record = {**holders.me(), "token": uuid.uuid4().hex, "since": now,
              "renewed": now}
    for _ in range(3):  # another taker may move a stale file under us
      holder = _read(path)
      if holder is not None:
        if not stale(holder, lease_secs):
          raise WorkdirError(_held_message(workdir.root, holder, lease_secs))
        if not _set_aside(path, holder):
          continue
        logging.warning(
            "Took over --workdir=%s from a run that is gone (host %s, pid %s,"
            " since %s)", workdir.root, holder.get("host"), holder.get("pid"),
            _since(holder.get("since", 0)))
      with files.on_full_disk(workdir.root, "lease.json",
                              workdir.checkpoints):
        created = files.create(path, json.dumps(record))
      if created:
        return cls(workdir, record, lease_secs)
    raise WorkdirError(
        f"--workdir={workdir.root}: another run is taking {path} at this"
        " moment; start one run per workdir, or choose another --workdir")

  def check(self) -> None:
    """Raises WorkdirError if another run holds the lease now."""
    holder = _read(self.path)
    if holder is None or holder.get("token") != self.record["token"]:
      who = (f"nobody ({self.path} was deleted)" if holder is None else
             f"host {holder.get('host')} pid {holder.get('pid')} since"
             f" {_since(holder.get('since', 0))}")
      raise WorkdirError(
          f"--workdir={self._workdir} is now held by {who}: this run's lease"
          f" lapsed (not renewed for checkpoint.lease_secs="
          f"{self._lease_secs:g}, e.g. while its host was cut off), so it"
          " stops without saving and leaves the workdir to that run")

  def _renew_loop(self) -> None:
    while not self._done.wait(self._lease_secs / 4):
      try:
        holder = _read(self.path)
        if holder is None or holder.get("token") != self.record["token"]:
          return  # lapsed: the next save's check() says so
        self.record["renewed"] = time.time()
        files.write_text(self.path, json.dumps(self.record))
      except (tf.errors.OpError, OSError) as e:  # retried next time
        logging.warning("Could not renew %s: %s", self.path, e)

  def release(self) -> None:
    """Stops renewing and deletes the file if it is still ours."""
    self._done.set()
    self._thread.join()
    holder = _read(self.path)
    if holder is not None and holder.get("token") == self.record["token"]:
      tf.io.gfile.remove(self.path)


def _held_message(workdir: str, holder: dict, lease_secs: float) -> str:
  age = time.time() - holder.get("renewed", 0)
  return (
      f"--workdir={workdir} is held by another run (host {holder.get('host')},"
      f" pid {holder.get('pid')}, since {_since(holder.get('since', 0))};"
      f" renewed {age:.0f} s ago): stop that run or choose another --workdir."
      f" A holder that died frees it: on its host once its PID is gone, from"
      f" another host {lease_secs:g} s after its last renewal"
      " (checkpoint.lease_secs)")


def _read(path: str) -> dict | None:
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.loads(f.read())
  except tf.errors.NotFoundError:
    return None
  except ValueError:  # a torn write of a crashed writer: nobody holds it
    return {}


def _set_aside(path: str, holder: dict) -> bool:
  """Moves the stale file `holder` came from aside; False if another taker
  replaced it first (a fresh lease moved by mistake is put back)."""
  aside = f"{path}.stale-{uuid.uuid4().hex}"
  try:
    tf.io.gfile.rename(path, aside, overwrite=False)
  except tf.errors.NotFoundError:
    return False
  moved = _read(aside)
  if (moved or {}).get("token") != holder.get("token"):
    try:
      tf.io.gfile.rename(aside, path, overwrite=False)
    except tf.errors.AlreadyExistsError:
      tf.io.gfile.remove(aside)  # a third taker holds it now
    return False
  tf.io.gfile.remove(aside)
  return True
