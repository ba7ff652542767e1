"""A workdir on an object store: the whole cycle on TensorFlow's ram://.

ram:// is reached only through tf.io.gfile, as gs:// is (whose fixed
endpoint no local emulator can stand in for), and it cannot rename a folder
at once either (it moves the folder's own entry and leaves its files). In
this process: a train, a resume past the lines a killed attempt left,
--mode=eval, --mode=export, `looper runs` and the lease, while every os /
open / shutil call looper's own code makes on a ram:// path raises. The
reference is the same cycle on the local disk: the same files, curve,
weights, evaluation, table row and served outputs. BUILD.md "Object
storage" says what holds on gs:// and s3://.
"""

import builtins
import io
import json
import logging
import os
import shutil
import sys
import sysconfig
import time
import uuid

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from looper import run
from looper import workdir as workdir_lib
from looper.cli import runs
from looper.data import datasets
from looper.errors import ConfigError
from looper.errors import WorkdirError
from looper.workdir import files
from looper.workdir import jsonl
from looper.workdir import lease
from tests.fixtures import configs
from tests.fixtures import events
from tests.fixtures import paths
from tests.fixtures import tiny

LOOPER = os.path.join(str(paths.ROOT), "looper") + os.sep
STDLIB = sysconfig.get_paths()["stdlib"]
# Every call that reaches a file by its path without tf.io.gfile (os.path,
# pathlib, glob and the rest of shutil reach it through these os calls).
RAW = ((builtins, "open"), (io, "open"), (os, "open"), (os, "stat"),
       (os, "lstat"), (os, "listdir"), (os, "scandir"), (os, "mkdir"),
       (os, "makedirs"), (os, "remove"), (os, "unlink"), (os, "rename"),
       (os, "replace"), (os, "link"), (os, "rmdir"), (os, "access"),
       (shutil, "rmtree"), (shutil, "copyfile"), (shutil, "move"))
STEPS = 20
FIELDS = {"train.steps_per_loop": 5, "eval.every_steps": 10,
          "checkpoint.every_steps": 10, "checkpoint.best_metric": "accuracy",
          "export.at_end": True,
          "checkpoint.lease_secs": 1.0}  # renewed every 0.25 s meanwhile
# What differs between two runs of the same thing: not compared.
CLOCK = ("time", "steps_per_sec", "examples_per_sec", "tokens_per_sec",
         "flops_per_sec", "mfu", "input_wait_fraction")


def _on_ram(arg) -> bool:
  if isinstance(arg, os.PathLike):
    arg = os.fspath(arg)
  if isinstance(arg, bytes):
    arg = arg.decode(errors="replace")
  # Also a URL that os.path.abspath made "/cwd/ram:/...".
  return isinstance(arg, str) and "ram:/" in arg


def _called_from_looper() -> bool:
  """Whether the first caller outside the standard library (os.path and
  shutil call os themselves) is looper's code."""
  frame = sys._getframe(2)  # pylint: disable=protected-access
  while frame is not None:
    name = frame.f_code.co_filename
    if not (name.startswith("<frozen") or (
        name.startswith(STDLIB) and "site-packages" not in name)):
      return name.startswith(LOOPER)
    frame = frame.f_back
  return False


@pytest.fixture
def raw_calls(monkeypatch):
  """The raw calls looper's code made on ram:// paths; each also raises."""
  made = []

  def guarded(real, name):
    def call(*args, **kwargs):
      if any(map(_on_ram, args)) and _called_from_looper():
        made.append(f"{name}{args!r}")
        raise AssertionError(f"looper called {name}{args!r}: use tf.io.gfile")
      return real(*args, **kwargs)
    return call

  for module, name in RAW:
    monkeypatch.setattr(module, name, guarded(getattr(module, name),
                                              f"{module.__name__}.{name}"))
  return made


@pytest.fixture
def ram():
  root = f"ram://looper-{uuid.uuid4().hex[:8]}"
  yield root
  if tf.io.gfile.exists(root):
    tf.io.gfile.rmtree(root)


def test_the_guard_catches_a_raw_call_in_looper(raw_calls):
  probe = compile("os.path.isdir(path)", os.path.join(LOOPER, "probe.py"),
                  "exec")
  with pytest.raises(AssertionError, match=r"looper called os.stat\("):
    exec(probe, {"os": os, "path": "ram://w/train"})
  assert os.path.isdir("ram://w/train") is False  # not looper's: allowed
  assert raw_calls == ["os.stat('ram://w/train',)"]


def _config(steps: int):
  return configs.configured(tiny.get_config(), FIELDS, train__steps=steps)


def _cycle(root: str) -> dict:
  """Train to STEPS; the lines of an attempt killed past it; a resume to
  2 * STEPS; --mode=eval; --mode=export. The results by mode."""
  results = {"train": run.run(_config(STEPS), root, "train_and_eval")}
  jsonl.MetricsLog(workdir_lib.Workdir(root).metrics).write(
      "train", STEPS + 5, {"loss": 9.0})
  results["resume"] = run.run(_config(2 * STEPS), root, "train_and_eval")
  results["eval"] = run.run(_config(2 * STEPS), root, "eval")
  results["export"] = run.run(_config(2 * STEPS), root, "export")
  return results


def _files(root: str) -> dict[str, int]:
  """{relative path: count} of every file under `root`, read through
  tf.io.gfile; event files (named by time and PID) counted by folder."""
  found = {}
  for depth in range(1, 7):
    for path in tf.io.gfile.glob(root + "/*" * depth):
      if tf.io.gfile.isdir(path):
        continue
      name = os.path.relpath(path, root) if workdir_lib.posix(root) else (
          path[len(root) + 1:])
      if "tfevents" in name:
        name = os.path.join(os.path.dirname(name), "<events>")
      found[name] = found.get(name, 0) + 1
  return found


def _steady(lines: list[dict]) -> list[dict]:
  return [{k: v for k, v in l.items() if k not in CLOCK} for l in lines]


def _tensors(prefix: str) -> dict[str, np.ndarray]:
  """The values checkpoints.checkpoint_tensors compares, read another way:
  tf.train.load_checkpoint takes a ram:// prefix for a folder (ram:// calls
  any prefix of a name one)."""
  reader = tf.compat.v1.train.NewCheckpointReader(prefix)
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if "save_counter" not in k and k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _served(export_dir: str, x: np.ndarray) -> dict[str, np.ndarray]:
  serve = tf.saved_model.load(export_dir).signatures["serving_default"]
  return {k: v.numpy() for k, v in serve(inputs=tf.constant(x)).items()}


@pytest.mark.slow  # trains for seconds (a mounted disk / a whole cycle)
def test_a_whole_cycle_on_an_object_store_equals_the_local_disk(
    ram, raw_calls, tmp_path, monkeypatch, caplog, capsys):
  caplog.set_level(logging.INFO, logger="absl")
  local = str(tmp_path / "run")
  expected = _cycle(local)
  renames = []
  rename = tf.io.gfile.rename
  monkeypatch.setattr(tf.io.gfile, "rename", lambda src, dst, **kw: (
      renames.append(dst), rename(src, dst, **kw))[-1])
  root = f"{ram}/run"
  got = _cycle(root)
  assert raw_calls == []

  # The same files but metrics.jsonl: parts there; the killed attempt's
  # part went whole at the resume, which wrote one of its own in its place.
  local_files, ram_files = _files(local), _files(root)
  assert local_files.pop("metrics.jsonl") == 1
  assert sorted(n for n in ram_files if n.startswith("metrics.jsonl")) == [
      "metrics.jsonl/000001.jsonl", "metrics.jsonl/000002.jsonl"]
  assert {n: c for n, c in ram_files.items()
          if not n.startswith("metrics.jsonl")} == local_files
  assert not [n for n in ram_files if n.endswith(".tmp") or "partial" in n
              or "_temp" in n or n == "lease.json"]

  # What was written reads back the same: lines, curve, weights, results.
  wd, ref = workdir_lib.Workdir(root), workdir_lib.Workdir(local)
  lines = jsonl.read(wd.metrics)
  assert _steady(lines) == _steady(jsonl.read(ref.metrics))
  assert [l["step"] for l in lines if l["kind"] == "train"] == list(
      range(5, 2 * STEPS + 1, 5))
  np.testing.assert_array_equal(events.curve(wd.train_events),
                                events.curve(ref.train_events))
  prefixes = [n[:-len(".index")] for n in local_files if n.endswith(".index")
              and n.startswith("checkpoints/")]
  assert len(prefixes) >= 4  # the rolling ones and the best
  for prefix in prefixes:
    theirs = _tensors(os.path.join(local, prefix))
    ours = _tensors(f"{root}/{prefix}")
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
      np.testing.assert_array_equal(ours[key], value, err_msg=key)
  for ours, theirs in ((wd.config, ref.config),
                       (wd.best_history, ref.best_history)):
    with tf.io.gfile.GFile(ours) as f, open(theirs) as g:
      assert json.load(f) == json.load(g), ours
  for mode in ("train", "resume", "eval"):
    assert got[mode]["eval"] == expected[mode]["eval"], mode
  assert got["export"]["export"] == wd.export_version(2 * STEPS)
  x, _ = tiny.make_data(7, seed=5)
  served, reference = _served(wd.export_version(2 * STEPS), x), _served(
      ref.export_version(2 * STEPS), x)
  assert served.keys() == reference.keys()
  for key in served:
    np.testing.assert_array_equal(served[key], reference[key])
  # Each export moved file by file into its version, saved_model.pb last.
  exports, moving = [], []
  for target in (d for d in renames if "/export/" in d):
    moving.append(target)
    if os.path.basename(target) == "saved_model.pb":
      exports.append(moving)
      moving = []
  assert not moving
  assert [os.path.dirname(e[-1]) for e in exports] == [
      wd.export_version(STEPS), *[wd.export_version(2 * STEPS)] * 2]
  for export in exports:
    assert len(export) > 2  # the variables too
    assert all(t.startswith(os.path.dirname(export[-1]) + "/")
               for t in export)

  # `looper runs`: the row the local run gets, on its own and one level down.
  row = runs.summarize(root)
  assert row["run"] == root
  reference_row = runs.summarize(local)
  # Each attempt's time is its own; the records were read from ram://.
  assert row["goodput"].endswith("%")
  for name in ("run", runs.WALL, "goodput"):
    del row[name], reference_row[name]
  assert row == reference_row
  capsys.readouterr()
  assert runs.main([ram]) == 0
  cells = [[c.strip() for c in line.split("|")[1:-1]]
           for line in capsys.readouterr().out.splitlines()]
  assert cells[2][:2] == [root, str(2 * STEPS)] and len(cells) == 3

  # The lease: taken by each training run (written through tf.io.gfile),
  # advisory and said so once per run; released.
  assert sum(d == wd.lease for d in renames) >= 2
  notes = [r.getMessage() for r in caplog.records
           if "its lease is advisory" in r.getMessage()]
  assert notes == [
      f"--workdir={root} is on an object store: its lease is advisory (no"
      " exclusive create there); start one run per workdir (BUILD.md"
      " 'Object storage')"] * 2
  assert not tf.io.gfile.exists(wd.lease)


def test_the_lease_on_an_object_store_refuses_a_second_taker(ram, raw_calls):
  wd = workdir_lib.Workdir(f"{ram}/run")
  held = lease.Lease.take(wd, lease_secs=0.4)
  try:
    with pytest.raises(WorkdirError, match=(
        rf"--workdir={wd.root} is held by another run \(host .*, pid"
        rf" {os.getpid()}, since .*\): stop that run or choose another")):
      lease.Lease.take(wd, lease_secs=0.4)
    first = held.record["renewed"]
    deadline = time.monotonic() + 30
    # Renewed every 0.1 s (a read meeting a rename under way finds none).
    while (files.read_json(wd.lease) or {}).get("renewed", 0) <= first:
      assert time.monotonic() < deadline, "the lease was never renewed"
      time.sleep(0.01)
    held.check()
  finally:
    held.release()
  assert not tf.io.gfile.exists(wd.lease)
  assert raw_calls == []


def test_metrics_parts_read_and_truncate_as_the_file_does(
    ram, tmp_path, monkeypatch):
  monkeypatch.setattr(jsonl, "PART_LINES", 2)
  logs = [jsonl.MetricsLog(f"{ram}/metrics.jsonl"),
          jsonl.MetricsLog(str(tmp_path / "metrics.jsonl"))]
  for log in logs:
    log.start()
    for step in (10, 20, 30, 40):
      log.write("train", step, {"loss": step / 100})
    log.truncate_after(20)
    log.write("train", 30, {"loss": 0.5})
  ours, theirs = (jsonl.read(log.path) for log in logs)
  assert _steady(ours) == _steady(theirs) == [
      {"kind": "start", "step": 0}, {"kind": "train", "step": 10, "loss": 0.1},
      {"kind": "train", "step": 20, "loss": 0.2},
      {"kind": "train", "step": 30, "loss": 0.5}]
  # Parts of two lines; the one of steps 30 and 40 went whole, and the
  # resumed attempt wrote a new one in its place.
  assert sorted(tf.io.gfile.listdir(logs[0].path)) == [
      "000001.jsonl", "000002.jsonl", "000003.jsonl"]
  assert [l["loss"] for l in jsonl.read(f"{logs[0].path}/000003.jsonl")] == [
      0.5]


def test_a_data_dir_on_an_object_store_is_searched_through_gfile(
    ram, raw_calls):
  inner = f"{ram}/data/cifar-10-batches-py"
  tf.io.gfile.makedirs(inner)
  with tf.io.gfile.GFile(f"{inner}/data_batch_1", "w") as f:
    f.write("batch")

  def find(directory):
    path = os.path.join(directory, "data_batch_1")
    if not tf.io.gfile.exists(path):
      return None
    with tf.io.gfile.GFile(path) as f:
      return directory, f.read()

  data = ml_collections.ConfigDict({
      "dir": f"{ram}/data", "cache_dir": "/nonexistent", "url": "",
      "file_hash": ""})
  assert datasets.locate(data, "CIFAR-10", find, expected="data_batch_1") == (
      inner, "batch")
  data.dir, data.cache_dir = "", "gs://bucket/cache"
  with pytest.raises(ConfigError) as e:
    datasets.locate(data, "CIFAR-10", find, expected="data_batch_1")
  assert str(e.value) == (
      "config.data.cache_dir='gs://bucket/cache' is not a local folder, and"
      " Keras downloads only to a local disk; set --config.data.cache_dir to"
      " one, or copy the files to the bucket and set --config.data.dir")
  assert raw_calls == []
