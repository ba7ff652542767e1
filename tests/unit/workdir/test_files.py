"""looper.workdir.files: how every file of a run is written, and the one line
for a full disk.

Writers that meet, deterministically (one writer's temporary open while
another replaces the file) and in threads with a reader; a local disk
beside TensorFlow's ram:// (an object store: no append in place, no
exclusive create). Then each kind of writer looper has, its storage
refusing the write as TensorFlow does ("<file>; No space left on device"):
the line is the same words for all, comes from `files.full_disk` once, and
no temporary is left.
"""

import os
import pathlib
import threading
import uuid

import numpy as np
import pytest
import tensorflow as tf

from looper import errors
from looper import modes
from looper import references
from looper import workdir
from looper.control import actions
from looper.control import eval_action
from looper.measure import goodput
from looper.control import profiler
from looper.options import best
from looper.workdir import checkpoint
from looper.workdir import files
from looper.workdir import lease
from looper.workdir import summaries
from tests.fixtures import tiny


@pytest.fixture
def ram():
  root = f"ram://looper-files-{uuid.uuid4().hex[:8]}"
  yield root
  if tf.io.gfile.exists(root):
    tf.io.gfile.rmtree(root)


def test_a_writer_never_meets_another_in_its_temporary(tmp_path):
  path = tmp_path / "history.json"
  with files.replacing(str(path)) as mine:
    with tf.io.gfile.GFile(mine, "w") as f:
      f.write("first, half")
    files.write_text(str(path), "second")  # another writer, meanwhile
    assert path.read_text() == "second"
    assert pathlib.Path(mine).read_text() == "first, half"  # not its
    with tf.io.gfile.GFile(mine, "a") as f:
      f.write(", whole")
  assert path.read_text() == "first, half, whole"
  assert os.listdir(tmp_path) == ["history.json"]


def test_concurrent_writers_and_a_reader_see_only_whole_files(tmp_path):
  path = str(tmp_path / "goodput.json")
  record = files.JsonFile(path, str(tmp_path / "checkpoints"))
  texts = {w: {"writer": w, "pad": "x" * 20000} for w in ("a", "b")}
  record.write(texts["a"])
  failed, seen, done = [], set(), threading.Event()

  def write(writer):
    try:
      for _ in range(100):
        record.write(texts[writer])
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  def read():
    while not done.is_set():
      value = record.read()
      seen.add(value["writer"] if value == texts.get(
          value and value["writer"]) else "torn")

  threads = [threading.Thread(target=write, args=(w,)) for w in texts]
  reader = threading.Thread(target=read)
  reader.start()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  done.set()
  reader.join()
  assert failed == [] and "torn" not in seen and seen
  assert record.read() in texts.values()
  assert os.listdir(tmp_path) == ["goodput.json"]


@pytest.mark.parametrize("where", ["local", "ram"])
def test_replace_create_and_read_on_each_store(tmp_path, ram, where):
  root = str(tmp_path) if where == "local" else ram
  path = os.path.join(root, "runs", "a.json")
  record = files.JsonFile(path, os.path.join(root, "checkpoints"))
  assert record.read() is None
  record.write({"n": 1})
  record.write({"n": 2})  # ram:// would append to a file opened anew
  assert record.read() == {"n": 2}
  lease_path = os.path.join(root, "lease.json")
  assert files.create(lease_path, "mine") is True
  assert files.create(lease_path, "theirs") is False
  with tf.io.gfile.GFile(lease_path) as f:
    assert f.read() == "mine"
  files.write_text(path, "{not json")
  assert files.read_json(path) is None
  assert sorted(tf.io.gfile.listdir(root)) == ["lease.json", "runs"]
  assert tf.io.gfile.listdir(os.path.join(root, "runs")) == ["a.json"]


def test_append_grows_a_local_file_in_place(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  files.append_text(path, "1\n")
  files.append_text(path, "2\n")
  assert pathlib.Path(path).read_text() == "1\n2\n"


# --- A full disk, for each kind of writer ------------------------------------

_GFILE = tf.io.gfile.GFile


class _Refusing:
  """tf.io.gfile.GFile on a full disk: a file opened for writing is made
  (as TensorFlow's is) and its first write fails as TensorFlow's does."""

  def __init__(self, path, mode="r"):
    self._file = _GFILE(path, mode)
    self._path, self._writes = path, "w" in mode or "a" in mode

  def write(self, data):
    if self._writes:
      raise tf.errors.ResourceExhaustedError(
          None, None, f"{self._path}; No space left on device")
    return self._file.write(data)

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self._file.close()

  def __getattr__(self, name):
    return getattr(self._file, name)

  def __iter__(self):
    return iter(self._file)


def _refused(path):
  return tf.errors.ResourceExhaustedError(
      None, None, f"{path}; No space left on device")


class _Stub:
  """An Evaluator, Summaries and Checkpointer for the eval action."""

  def evaluate(self):
    return {"accuracy": 0.5, "loss": 1.0}

  def eval(self, step, logs):
    pass

  def save_best(self, step):
    pass


def _config_json(wd, ckpt):
  c = tiny.get_config()
  modes.open_workdir(wd, references.to_json(c), modes.MODES["train"], True,
                     total_steps=c.train.steps, eval_names=[], input_hint="",
                     trackers=[])


def _history(wd, ckpt):
  eval_action.EvalAction(
      _Stub(), _Stub(), checkpointer=_Stub(),
      history=files.JsonFile(wd.best_history, wd.checkpoints),
      best=best.Best("accuracy", "max")).evaluate(5)


def _goodput(wd, ckpt):
  goodput.Ledger(wd, started=0.0, clock=lambda: 1.0).close("finished")


def _lease(wd, ckpt):
  lease.Lease.take(wd, lease_secs=60)


def _metrics(wd, ckpt):
  summaries.Summaries(wd, chief=True, total_steps=10, trains=True
                      ).start_run("{}", "model")


def _profile(wd, ckpt):
  def stop():  # TensorFlow writes the trace as it stops
    raise _refused(f"{wd.profile}/2026_11_27/host.xplane.pb")
  window = profiler.Window(wd, start_step=1, num_steps=1,
                           start=lambda logdir: None, stop=stop)
  window.start(actions.Moment(1, 10))
  window(actions.Moment(2, 10))


def _checkpoint(wd, ckpt):
  ckpt.save(2)


# Each writer: where its line says the write went, and what it wrote.
WRITERS = {
    _config_json: lambda wd: (wd.root, "config.json"),
    _history: lambda wd: (wd.best_checkpoints, "history.json"),
    _goodput: lambda wd: (wd.goodput, "attempt-1.json"),
    _lease: lambda wd: (wd.root, "lease.json"),
    _metrics: lambda wd: (wd.root, "metrics.jsonl"),
    _profile: lambda wd: (wd.profile, "the profile"),
    _checkpoint: lambda wd: (wd.checkpoints, "checkpoint ckpt-2"),
}


@pytest.mark.parametrize("write", WRITERS,
                         ids=lambda f: f.__name__.strip("_"))
def test_every_writer_meets_a_full_disk_with_the_one_line(
    tmp_path, monkeypatch, write):
  wd = workdir.Workdir(str(tmp_path / "run"))
  ckpt = checkpoint.Checkpointer(wd, {"v": tf.Variable(np.arange(4.0))},
                                 keep=2, chief=True, task_id=0)
  ckpt.save(1)
  kept = pathlib.Path(wd.checkpoints) / "ckpt-1"
  size = sum(p.stat().st_size for p in kept.parent.glob("ckpt-1.*"))
  lines = []
  full_disk = files.full_disk
  monkeypatch.setattr(files, "full_disk", lambda *args, **kwargs: (
      lines.append(full_disk(*args, **kwargs)) or lines[-1]))
  monkeypatch.setattr(tf.io.gfile, "GFile", _Refusing)
  def save(self, checkpoint_number=None, **unused):  # TensorFlow's writes
    raise _refused(f"{self.directory}/ckpt-{checkpoint_number}_temp/part")
  monkeypatch.setattr(tf.train.CheckpointManager, "save", save)
  with pytest.raises(errors.DiskFull) as e:
    write(wd, ckpt)
  directory, what = WRITERS[write](wd)
  need = (f", which needs about {size} bytes (the size of ckpt-1)"
          if write is _checkpoint else "")
  assert str(e.value) == (
      f"{directory}: no space left on device writing {what}{need}; {kept} is"
      " kept, and a rerun resumes from it; free space there or move"
      " --workdir to a larger disk, then rerun the same command")
  assert lines == [e.value]  # one translation, reached once
  assert not [p for p in tmp_path.rglob("*")
              if ".tmp" in p.name or "_temp" in p.name]


def test_another_error_passes_unchanged(tmp_path):
  with pytest.raises(tf.errors.InternalError, match="^a bug$"):
    with files.on_full_disk(str(tmp_path), "config.json",
                            str(tmp_path / "checkpoints")):
      raise tf.errors.InternalError(None, None, "a bug")
