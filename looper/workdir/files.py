"""Writing a run's files on a local disk or an object store; the one line for a full disk.

Synopsis::

    from looper.workdir import files
    wd = workdir.Workdir("/tmp/mnist")           # or gs://bucket/mnist
    with files.on_full_disk(wd.root, "config.json", wd.checkpoints):
      files.makedirs(wd.root)
      files.write_text(wd.config, text)          # replaced whole
    files.append_text(wd.metrics, line)          # a local file grows in place
    files.create(wd.lease, text)                 # False: it exists
    history = files.JsonFile(wd.best_history, wd.checkpoints)
    history.write({"metric": "accuracy", ...})   # its folder made if missing
    history.read()                               # None: none (or unparsable)

Every file looper itself writes for a run is opened for writing here, and
its folder made here; TensorFlow writes checkpoints, events, SavedModels
and traces itself, each refusal of theirs turned into the same line by the
module that calls it (`tests/test_layout.py` holds the rule). Paths are
strings reached through tf.io.gfile, the same on a local disk and on an
object store (gs://, s3://; ram:// in the tests).

What holds where (`looper.workdir.posix` tells the two apart; BUILD.md
"Object storage"): an object store writes an object whole and replaces one
whole by a rename (a copy, then a delete), but appends by rewriting the
object and has no exclusive create. So a file is replaced through a
temporary of this writer's own (`replacing`: a unique name, so two writers
or a crashed one never meet in it) renamed over it, which is atomic
locally and whole on a store; an append is local only (a store's caller
writes parts: looper.workdir.jsonl); an exclusive create is a hard link
locally and a look, then a write, on a store (advisory: looper.workdir.lease).

A full disk: a write the storage refuses (no space, over quota, read-only,
no permission) ends the run in ONE line, errors.DiskFull, naming the
folder, what was being written, the size it needs if known, the newest
checkpoint (kept: a rerun resumes from it) and the fix (`full_disk`,
`on_full_disk`); every writer's refusal goes through it.
"""

import contextlib
import dataclasses
import errno
import json
import os
from typing import Any, Callable, Iterator
import uuid

from absl import logging
import tensorflow as tf

from looper import errors
from looper import workdir as workdir_lib


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
  """A temporary path for the block to write, renamed over `path` when it
  completes and removed if it fails (a full disk leaves nothing behind).

  Beside `path`, hidden and unique to this writer; its name holds no part
  of `path`'s, so a reader listing the folder by name (TensorBoard's
  `*tfevents*`, metrics parts `*.jsonl`) never takes it for the file.
  """
  tmp = _temporary(path)
  try:
    yield tmp
    tf.io.gfile.rename(tmp, path, overwrite=True)
  except BaseException:
    _remove_quietly(tmp)
    raise


def _temporary(path: str) -> str:
  return os.path.join(os.path.dirname(path), f".looper-{uuid.uuid4().hex}.tmp")


def _remove_quietly(path: str) -> None:
  """Removes a temporary a failed write left; a store refusing this too is
  only logged: the write's own error is the one reported."""
  try:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
  except (tf.errors.OpError, OSError) as e:
    logging.warning("Could not remove %s: %s", path, errors.first_line(e))


def write_text(path: str, text: str | bytes) -> None:
  """Replaces the file at `path` by `text` (or bytes), whole, on any store
  (`replacing`; also as TensorFlow's ram:// would append to a file opened
  anew)."""
  with replacing(path) as tmp:
    with tf.io.gfile.GFile(tmp, "wb" if isinstance(text, bytes) else "w") as f:
      f.write(text)


def append_text(path: str, text: str) -> None:
  """Adds `text` at the end of the local file at `path` (made if missing).
  On an object store an append rewrites the whole object: write parts."""
  with tf.io.gfile.GFile(path, "a") as f:
    f.write(text)


def makedirs(path: str) -> None:
  """Makes the folder at `path` and its parents if missing."""
  tf.io.gfile.makedirs(path)


def remove(path: str) -> None:
  """Removes the file at `path` (a tracker's store a kill left half made:
  looper.trackers.mlflow; a write the tracker holds: looper.workdir.spool)."""
  tf.io.gfile.remove(path)


def create(path: str, text: str) -> bool:
  """Writes `text` as the file at `path` unless one is there; False if one
  is (another writer won).

  Locally a hard link of a finished temporary: atomic, and it fails if the
  name exists, so no reader ever sees half of it. On an object store a
  look, then a write: two writers at once may both succeed (module doc).
  """
  if not workdir_lib.posix(path):
    if tf.io.gfile.exists(path):
      return False
    write_text(path, text)
    return True
  tmp = _temporary(path)
  try:
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write(text)
    # The one call past tf.io.gfile, on a local path only: gfile has no
    # exclusive create.
    os.link(tmp, path)
  except FileExistsError:
    return False
  finally:
    _remove_quietly(tmp)  # also when a full disk refused it
  return True


def read_json(path: str) -> Any:
  """The JSON value in the file at `path`; None where there is none (a
  run's config.json before its first start) or it does not parse."""
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  except (tf.errors.OpError, ValueError):
    return None


@dataclasses.dataclass(frozen=True)
class JsonFile:
  """A JSON file of a run (history.json, a goodput record), replaced whole
  at each write.

  Args:
    path: where it is (a `Workdir` path).
    checkpoints: the run's `Workdir.checkpoints`: a full disk's line names
      the newest checkpoint there as kept.
  """
  path: str
  checkpoints: str

  def read(self) -> Any:
    """Its value; None if there is none (or it does not parse)."""
    return read_json(self.path)

  def write(self, value: Any, indent: int | None = None) -> None:
    """Replaces it by `value`, its folder made if missing; a write the
    storage refuses ends in one line naming the folder (`on_full_disk`)."""
    folder = os.path.dirname(self.path)
    with on_full_disk(folder, os.path.basename(self.path), self.checkpoints):
      makedirs(folder)
      write_text(self.path, json.dumps(value, indent=indent))


# --- A full disk: the one line ------------------------------------------------

# What the storage says when it refuses a write (errno: the C library's
# words for it, which TensorFlow's messages end in: "<file>; <strerror>"),
# and what to do about it.
_REFUSED = {
    errno.ENOSPC: ("no space left on device",
                   "free space there or move --workdir to a larger disk"),
    errno.EDQUOT: ("the disk quota is exceeded",
                   "free space or raise the quota"),
    errno.EROFS: ("the file system is read-only",
                  "make it writable or choose another --workdir"),
    errno.EACCES: ("permission denied",
                   "let this user write there or choose another --workdir"),
    errno.EPERM: ("the write is not permitted",
                  "let this user write there or choose another --workdir"),
}


def storage_refused(e: BaseException) -> tuple[str, str] | None:
  """(what the storage said, the fix) if `e` is a write the storage
  refused (full, over quota, read-only, no permission), else None.

  Local disks: an OSError's errno, or its words in TensorFlow's message;
  object stores: TensorFlow's ResourceExhaustedError (quota) and
  PermissionDeniedError, whose words vary by store.
  """
  if getattr(e, "errno", None) in _REFUSED:
    return _REFUSED[e.errno]
  text = str(e)
  for code, refused in _REFUSED.items():
    if os.strerror(code) in text:
      return refused
  if isinstance(e, OSError):  # not TensorFlow's
    return _REFUSED[errno.EACCES] if isinstance(e, PermissionError) else None
  if isinstance(e, tf.errors.PermissionDeniedError):
    return (f"permission denied ({errors.first_line(e)})",
            _REFUSED[errno.EACCES][1])
  if isinstance(e, tf.errors.ResourceExhaustedError) and "OOM" not in text:
    return (f"out of space or quota ({errors.first_line(e)})",
            _REFUSED[errno.EDQUOT][1])
  return None


def _size(num_bytes: int) -> str:
  """`num_bytes` as people read it: '1.5 MiB' (df -h's units)."""
  power = 0
  while num_bytes >= 1024 ** (power + 1) and power < 3:
    power += 1
  return (f"{num_bytes} bytes" if power == 0 else
          f"{num_bytes / 1024 ** power:.1f} {('KiB', 'MiB', 'GiB')[power - 1]}")


def full_disk(e: BaseException, directory: str, *, writing: str,
              checkpoints: str,
              needed: Callable[[], tuple[int, str] | None] | None = None
              ) -> errors.DiskFull | None:
  """The one line for a write into `directory` the storage refused; None
  if `e` is another error (it is the caller's to raise).

  Args:
    e: the write's error.
    directory: where the write went.
    writing: what was written ("checkpoint ckpt-100", "metrics.jsonl").
    checkpoints: the run's `Workdir.checkpoints`: its newest checkpoint is
      kept, and a rerun resumes from it.
    needed: (bytes, what they are the size of) when the size is known;
      asked only for a refused write.
  """
  refused = storage_refused(e)
  if refused is None:
    return None
  said, fix = refused
  size = needed() if needed else None
  need = f", which needs about {_size(size[0])} ({size[1]})" if size else ""
  kept = tf.train.latest_checkpoint(checkpoints)
  keeps = (f"{kept} is kept, and a rerun resumes from it" if kept else
           "no checkpoint was written yet, so a rerun starts over")
  return errors.DiskFull(f"{directory}: {said} writing {writing}{need};"
                         f" {keeps}; {fix}, then rerun the same command")


@contextlib.contextmanager
def on_full_disk(directory: str, writing: str, checkpoints: str):
  """A write of `writing` ("metrics.jsonl") into `directory` that the
  storage refuses ends in its one line (`full_disk`); other errors pass."""
  try:
    yield
  except (tf.errors.OpError, OSError) as e:
    line = full_disk(e, directory, writing=writing, checkpoints=checkpoints)
    if line is None:
      raise
    raise line from None
