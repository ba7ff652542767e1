"""A full disk: a save the storage refuses ends in one line, leaves nothing.

Real: a workdir on its own small tmpfs (as root; skipped with one line
elsewhere) fills up at a later checkpoint of a tiny run: exit 1, the last
line on stderr is looper's (the directory, the size needed, the checkpoint
kept), no `*_temp*` or temporary file is left, the kept checkpoint is the
latest and equals an uninterrupted run's; after the tmpfs grows, the same
command resumes and ends bit-exactly as the uninterrupted run. Injected
(in-process): each way a store refuses a write gives its own words and fix.
"""

import errno
import os
import pathlib
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from looper import errors
from looper import workdir
from looper.workdir import checkpoint
from looper.workdir import jsonl
from looper.workdir import summaries
from tests.fixtures.capabilities import lacks
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.configs import run_here
from tests.fixtures.events import curve
from tests.fixtures.processes import looper_lines, run_looper

# Wide enough that checkpoints, not events, fill the disk (SGD with
# momentum: ~420 KiB a checkpoint); the third save (step 60) is the first
# to need room for three while keep=2.
ARGS = ("--config=tests/fixtures/tiny.py", "--config.train.steps=120",
        "--config.checkpoint.every_steps=20", "--config.checkpoint.keep=2",
        "--config.eval.every_steps=60", "--config.model.width=4096")
PAGE = 4096  # tmpfs allocates whole pages


@pytest.fixture
def small_disk(tmp_path):
  """A directory on a tmpfs of its own; yields (path, resize(kib))."""
  if os.geteuid() != 0 or lacks("CAP_SYS_ADMIN"):
    pytest.skip("a small tmpfs needs root with CAP_SYS_ADMIN (mount -t"
                " tmpfs)")
  disk = tmp_path / "disk"
  disk.mkdir()
  mounted = subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)],
      capture_output=True, text=True, check=False)
  # Every prerequisite is here: a mount that fails is a failure.
  assert not mounted.returncode, f"mount -t tmpfs: {mounted.stderr.strip()}"

  def resize(kib: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={kib}k", str(disk)],
                   check=True)
  try:
    yield disk, resize
  finally:  # lazily: a failed test may still hold files open there
    subprocess.run(["umount", "--lazy", str(disk)], check=True)


def allocated(paths) -> int:
  """Bytes a tmpfs takes for these files (whole pages)."""
  return sum(-(-p.stat().st_size // PAGE) * PAGE for p in paths)


def files_of(prefix: pathlib.Path) -> list[pathlib.Path]:
  return sorted(prefix.parent.glob(prefix.name + ".*"))


def leftovers(root: pathlib.Path) -> list[str]:
  """What a failed write may leave: TensorFlow's and looper's temporaries."""
  return sorted(str(p) for p in root.rglob("*")
                if "_temp" in p.name or ".tmp" in p.name)


def assert_same_tensors(a: pathlib.Path, b: pathlib.Path) -> None:
  want, got = checkpoint_tensors(a), checkpoint_tensors(b)
  assert sorted(want) == sorted(got) and len(want) >= 5
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_disk_ends_in_one_line_and_the_rerun_resumes_exactly(
    tmp_path, small_disk, async_save):
  args = (*ARGS, f"--config.checkpoint.async_save={async_save}")
  reference = tmp_path / "reference"
  run_here(*args, "--config.checkpoint.keep=100", f"--workdir={reference}")
  ckpt = reference / "checkpoints" / "ckpt-20"
  one = allocated(files_of(ckpt))
  rest = allocated(p for p in reference.rglob("*") if p.is_file() and
                   not p.name.startswith("ckpt-"))
  # Two checkpoints and everything else fit; a third, mid-save, does not.
  disk, resize = small_disk
  resize((2 * one + rest + one // 2) // 1024)
  run = disk / "run"
  failed = run_looper(*args, f"--workdir={run}")
  assert failed.returncode == 1, failed.stderr[-3000:]
  checkpoints = run / "checkpoints"
  kept = checkpoints / "ckpt-40"
  size = sum(p.stat().st_size for p in files_of(kept))
  line = (f"looper: {checkpoints}: no space left on device writing"
          f" checkpoint ckpt-60, which needs about {size / 1024:.1f} KiB"
          f" (the size of ckpt-40); {kept} is kept, and a rerun resumes"
          " from it; free space there or move --workdir to a larger disk,"
          " then rerun the same command")
  assert failed.stderr.splitlines()[-1] == line, failed.stderr[-3000:]
  assert looper_lines(failed.stderr) == [line]
  assert leftovers(run) == []
  assert not list(checkpoints.glob("ckpt-60*"))
  assert tf.train.latest_checkpoint(str(checkpoints)) == str(kept)
  assert_same_tensors(reference / "checkpoints" / "ckpt-40", kept)

  resize(64 * 1024)
  run_here(*args, f"--workdir={run}")  # the rerun reads the disk alone
  np.testing.assert_array_equal(curve(run / "train"),
                                curve(reference / "train"))
  assert_same_tensors(reference / "checkpoints" / "ckpt-120",
                      checkpoints / "ckpt-120")
  assert leftovers(run) == []


# --- Injected: each way a store refuses a write -------------------------------

ENOSPC = ("no space left on device",
          "free space there or move --workdir to a larger disk")
QUOTA = ("the disk quota is exceeded", "free space or raise the quota")
READ_ONLY = ("the file system is read-only",
             "make it writable or choose another --workdir")
DENIED = ("permission denied",
          "let this user write there or choose another --workdir")


@pytest.mark.parametrize("error,said,fix", [
    (tf.errors.ResourceExhaustedError(
        None, None, "/w/checkpoints/ckpt-2_temp/part-00000-of-00001.data-"
        "00000-of-00001.tempstate1; No space left on device"), *ENOSPC),
    (OSError(errno.ENOSPC, "No space left on device"), *ENOSPC),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), *QUOTA),
    (tf.errors.PermissionDeniedError(
        None, None, "/w/checkpoints/ckpt-2_temp; Read-only file system"),
     *READ_ONLY),
    (PermissionError(errno.EACCES, "Permission denied"), *DENIED),
    (tf.errors.PermissionDeniedError(None, None, "403 Forbidden"),
     "permission denied (403 Forbidden)", DENIED[1]),
    (tf.errors.ResourceExhaustedError(None, None, "429 quota exceeded"),
     "out of space or quota (429 quota exceeded)", QUOTA[1]),
], ids=["tf-enospc", "enospc", "quota", "read-only", "no-permission",
        "store-denied", "store-quota"])
def test_a_refused_save_names_cause_size_and_kept_checkpoint(
    tmp_path, monkeypatch, error, said, fix):
  ckpt, directory = _saved_once(tmp_path)
  _refuse_saves(monkeypatch, error)
  with pytest.raises(errors.DiskFull) as e:
    ckpt.save(2)
  kept = directory / "ckpt-1"
  size = sum(p.stat().st_size for p in files_of(kept))
  assert str(e.value) == (
      f"{directory}: {said} writing checkpoint ckpt-2, which needs about"
      f" {size} bytes (the size of ckpt-1); {kept} is kept, and a rerun"
      f" resumes from it; {fix}, then rerun the same command")
  assert leftovers(tmp_path) == []
  assert sorted(p.name for p in directory.iterdir()) == [
      "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
  assert ckpt.restore() == str(kept)


def test_a_refused_first_save_says_a_rerun_starts_over(tmp_path, monkeypatch):
  ckpt = checkpoint.Checkpointer(workdir.Workdir(str(tmp_path)),
                                 {"v": tf.Variable(1.0)}, keep=2, chief=True,
                                 task_id=0)
  _refuse_saves(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
  with pytest.raises(errors.DiskFull) as e:
    ckpt.save(1)
  assert str(e.value) == (
      f"{tmp_path}/checkpoints: no space left on device writing checkpoint"
      " ckpt-1; no checkpoint was written yet, so a rerun starts over; free"
      " space there or move --workdir to a larger disk, then rerun the same"
      " command")
  assert leftovers(tmp_path) == []


def test_another_failed_save_passes_unchanged_and_leaves_nothing(
    tmp_path, monkeypatch):
  ckpt, directory = _saved_once(tmp_path)
  _refuse_saves(monkeypatch, tf.errors.InternalError(None, None, "a bug"))
  with pytest.raises(tf.errors.InternalError, match="^a bug$"):
    ckpt.save(2)
  assert leftovers(tmp_path) == []
  assert ckpt.restore() == str(directory / "ckpt-1")


def _saved_once(tmp_path):
  ckpt = checkpoint.Checkpointer(workdir.Workdir(str(tmp_path)),
                                 {"v": tf.Variable(np.arange(10.0))}, keep=2,
                                 chief=True, task_id=0)
  ckpt.save(1)
  return ckpt, tmp_path / "checkpoints"


def _refuse_saves(monkeypatch, error):
  """CheckpointManager.save writes what TensorFlow leaves mid-save (its
  `_temp` folder, a temporary index, a data file not yet indexed), then
  raises `error`."""
  def save(self, checkpoint_number=None, **unused):
    prefix = pathlib.Path(self.directory) / f"ckpt-{checkpoint_number}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    temp = prefix.parent / f"{prefix.name}_temp"
    temp.mkdir()
    (temp / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(
        b"x" * 100)
    (prefix.parent / f"{prefix.name}.data-00000-of-00001").write_bytes(b"x")
    (prefix.parent / "checkpoint.tmp0123abcd").write_text("partial")
    raise error
  monkeypatch.setattr(tf.train.CheckpointManager, "save", save)


# --- Real, in-process: an async save, a read-only store, events, metrics ----


@pytest.mark.slow  # trains for seconds (a mounted disk / a whole cycle)
@pytest.mark.parametrize("surfaces_at", ["wait", "next save"])
def test_a_background_save_that_fills_the_disk_is_the_same_line(
    small_disk, surfaces_at):
  disk, resize = small_disk
  ckpt = checkpoint.Checkpointer(
      workdir.Workdir(str(disk)), {"v": tf.Variable(tf.zeros([64, 1024]))},
      keep=2, chief=True, task_id=0, async_save=True)
  directory = disk / "checkpoints"
  ckpt.save(1)
  ckpt.wait()
  kept = directory / "ckpt-1"
  used = allocated(p for p in disk.rglob("*") if p.is_file())
  resize(used // 1024 + 128)  # ckpt-2 needs 256 KiB
  ckpt.save(2)  # returns at once; the write fails in the background
  size = sum(p.stat().st_size for p in files_of(kept))
  with pytest.raises(errors.DiskFull) as e:
    if surfaces_at == "wait":
      ckpt.wait()
    else:
      ckpt.save(3)
  assert str(e.value) == (
      f"{directory}: no space left on device writing checkpoint ckpt-2,"
      f" which needs about {size / 1024:.1f} KiB (the size of ckpt-1);"
      f" {kept} is kept, and a rerun resumes from it; {ENOSPC[1]}, then"
      " rerun the same command")
  assert leftovers(disk) == []
  assert ckpt.restore() == str(kept)


@pytest.mark.slow  # trains for seconds (a mounted disk / a whole cycle)
def test_a_read_only_store_is_named_as_such(small_disk):
  disk, _ = small_disk
  ckpt = checkpoint.Checkpointer(workdir.Workdir(str(disk)),
                                 {"v": tf.Variable(np.arange(10.0))}, keep=2,
                                 chief=True, task_id=0)
  ckpt.save(1)
  subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
  directory, kept = disk / "checkpoints", disk / "checkpoints" / "ckpt-1"
  size = sum(p.stat().st_size for p in files_of(kept))
  with pytest.raises(errors.DiskFull) as e:
    ckpt.save(2)
  assert str(e.value) == (
      f"{directory}: {READ_ONLY[0]} writing checkpoint ckpt-2, which needs"
      f" about {size} bytes (the size of ckpt-1); {kept} is kept, and a rerun"
      f" resumes from it; {READ_ONLY[1]}, then rerun the same command")
  assert ckpt.restore() == str(kept)


@pytest.mark.slow  # trains for seconds (a mounted disk / a whole cycle)
def test_events_and_metrics_on_a_full_disk_are_one_line(small_disk,
                                                         monkeypatch):
  disk, _ = small_disk
  wd = workdir.Workdir(str(disk))
  out = summaries.Summaries(wd, chief=True, total_steps=100, trains=True)
  out.start_run("{}", "model")
  tail = ("; no checkpoint was written yet, so a rerun starts over;"
          f" {ENOSPC[1]}, then rerun the same command")
  # The disk fills up: a ballast file takes all that is left.
  with open(disk / "ballast", "wb", buffering=0) as f, \
       pytest.raises(OSError, match="No space left"):
    while True:
      f.write(b"\0" * 65536)
  losses = np.linspace(1, 0, 100, dtype=np.float32)  # more than a page
  with pytest.raises(errors.DiskFull) as e:
    out.train(1, {"loss": losses}, {"loss": 0.5})
  assert str(e.value) == f"{disk}/train: {ENOSPC[0]} writing events{tail}"
  out.close()  # the failure was reported: not raised again
  (disk / "ballast").unlink()

  def refused(*unused, **unused_too):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(jsonl.MetricsLog, "write", refused)
  out = summaries.Summaries(wd, chief=True, total_steps=10, trains=True)
  with pytest.raises(errors.DiskFull) as e:
    out.eval(10, {"loss": 0.5})
  assert str(e.value) == f"{disk}: {ENOSPC[0]} writing metrics.jsonl{tail}"
  out.close()
  assert leftovers(disk) == []
