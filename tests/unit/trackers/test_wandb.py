"""W&B as the run's tracker, offline (no network here): a run and its rerun
write one W&B run (one id, two offline files, in the group
config.trackers_group names) whose history holds exactly
metrics.jsonl's lines, an action's images, histograms and texts at their
steps, the config with the changed field, and the final figures.

Read back from the offline files by looper.trackers.wandb_files (wandb
0.31 ships no reader of them: its `sync` is in the Go wandb-core), checked
here against metrics.jsonl, what looper wrote itself, and against the
records a plain de-framer (`records`, below: LevelDB's chunks, no checks)
finds in the same files; cut anywhere, a file reads as a prefix of its
records. Not tested: online mode and `wandb
sync` (no server), W&B's own drop of a step below its last one, a failure
mid-run (W&B sends in the background and retries itself).

Kills: killed right after `wandb.init`, after the Nth `Run.log`, and
inside `Run.finish`, then rerun, one workdir ends with one W&B run whose
files hold every (key, step) of metrics.jsonl once, the action's images,
histograms and texts exactly once a step (kept in the workdir until W&B's
files hold them), and the final figures. Each kill is
the process' own (tests/fixtures/killer.py), at a named call: no timing.
Repeated trials at other moments: `python -m tests.stress.wandb_kills`."""

import os
import struct
import subprocess
import sys
import tempfile
import time

import pytest

import looper
from looper import run
from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import jsonl
from tests.fixtures import needs
from tests.fixtures import private_home
from tests.fixtures import tiny
from tests.fixtures import tiny_media
from tests.fixtures.configs import configured

# wandb makes two folders in the temp dir as it loads, removed at the
# interpreter's exit, which the test session skips (tests/conftest.py):
# they go in the session's private tree, removed at its end.
_TEMP, tempfile.tempdir = tempfile.tempdir, os.environ[private_home.ROOT_VAR]
try:
  wandb = needs.extra("wandb", "wandb")
finally:
  tempfile.tempdir = _TEMP
from looper.trackers import wandb_files  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.fixtures import wandb_kills  # pylint: disable=g-import-not-at-top,wrong-import-position
from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top,wrong-import-position,g-bad-import-order


def records(path) -> list:
  """The records of a whole `.wandb` file, by the format alone (W&B's 7
  byte file header, then LevelDB's log: 32 KiB blocks of chunks, each a
  7 byte header (crc, length, type) and its bytes; FULL or FIRST, MIDDLE..,
  LAST): the reference looper's reader is checked against."""
  data, pos, parts, out = path.read_bytes(), 7, b"", []
  assert data[:4] == b":W&B"
  while pos + 7 <= len(data):
    if 32768 - pos % 32768 < 7:  # a block's tail too short for a header
      pos += 32768 - pos % 32768
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    parts += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # FULL, LAST
      record = wandb_internal_pb2.Record()
      record.ParseFromString(parts)
      out.append(record)
      parts = b""
  return out


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_a_run_and_its_rerun_are_one_wandb_run_holding_metrics_jsonl(
    tmp_path, monkeypatch, caplog):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_PROJECT", "tiny")
  # W&B names the process it starts in this one's environment
  # (WANDB_SERVICE): unset after the test, or the looper processes later
  # tests start would use it (and not be forked: tests/fixtures/forks.py).
  monkeypatch.setenv("WANDB_SERVICE", "")
  monkeypatch.delenv("WANDB_SERVICE")
  wd = workdir_lib.Workdir(str(tmp_path))

  config = configured(tiny.get_config(), trackers="wandb",
                      trackers_group="study", train__steps=30,
                      checkpoint__every_steps=10, eval__every_steps=10,
                      actions=[looper.Action(tiny_media.log_samples,
                                             every_steps=10)])
  run.run(config, wd.root, verbose=False)
  config.train.steps = 40
  with caplog.at_level("INFO"):
    run.run(config, wd.root)

  run_id = files.read_json(wd.tracker("wandb"))["run_id"]
  paths = wandb_files.paths(str(tmp_path), run_id)
  assert paths == sorted((tmp_path / "wandb").glob(
      f"offline-run-*-{run_id}/run-{run_id}.wandb")) and len(paths) == 2
  configs = {}
  for path in paths:
    assert wandb_files.records(path) == records(path), path
    for record in wandb_files.records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":  # in its group (a sweep's trials: the study's)
        assert (record.run.run_id, record.run.run_group) == (run_id, "study")
      elif kind == "config":
        configs.update(wandb_files.values(record.config.update))
  history = wandb_files.history(paths)
  rows = dict(history)
  assert [step for step, _ in history] == [10, 20, 30, 40]  # each once
  summary = wandb_files.summary(paths)
  assert sorted(rows) == [10, 20, 30, 40]
  for line in jsonl.read(wd.metrics):
    if line["kind"] in jsonl.PREFIXES:
      for name, value in jsonl.named(line).items():
        assert rows[line["step"]][name] == pytest.approx(value, rel=1e-15), (
            name, line["step"])
  for step, row in rows.items():
    assert (row["samples/_type"], row["samples/count"]) == (
        "images/separated", 2)
    assert (row["logits/_type"], row["logits/values"]) == (
        "histogram", [3, 3, 3, 3])
    assert row["note"] == f"step {step}"
  assert (configs["train.steps"], configs["looper.workdir"]) == (
      "40", wd.root)
  assert any(r.getMessage().startswith("wandb: fields changed since run") and
             "train.steps=40 (was 30)" in r.getMessage()
             for r in caplog.records)
  assert summary["hparams/eval_accuracy"] == pytest.approx(
      rows[40]["eval/accuracy"])
  assert 0 < summary["goodput/goodput"] < 1


@pytest.mark.slow  # looper processes, killed
def test_kills_at_each_named_moment_and_reruns_leave_one_exact_run(
    tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  # A W&B process this session started (WANDB_SERVICE) would serve the
  # runs and outlive their kills: each run starts its own.
  monkeypatch.delenv("WANDB_SERVICE", raising=False)
  for kill in wandb_kills.KILLS:
    proc = wandb_kills.attempt(tmp_path, kill)
    assert proc.returncode == -9, (kill, proc.stderr[-2000:])
  proc = wandb_kills.attempt(tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  paths = wandb_kills.check_run(tmp_path, attempts=len(wandb_kills.KILLS) + 1)
  # Cut anywhere (a kill mid-write), the largest file (records across a
  # 32 KiB block's end) reads as a growing prefix of its records.
  largest = max(paths, key=lambda p: p.stat().st_size)
  whole, data = wandb_files.records(largest), largest.read_bytes()
  assert len(data) > wandb_files.BLOCK
  cut, read = tmp_path / "cut.wandb", []
  for end in [*range(len(wandb_files.FILE_HEADER), len(data), 1009),
              len(data)]:
    cut.write_bytes(data[:end])
    read.append(len(wandb_files.records(cut)))
    assert wandb_files.records(cut) == whole[:read[-1]]
  assert read == sorted(read) and read[-1] == len(whole)


def test_the_files_are_read_once_no_process_writes_them(tmp_path):
  path = tmp_path / "run-x.wandb"
  path.write_bytes(wandb_files.FILE_HEADER)
  holder = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-c", "import sys; f = open(sys.argv[1], 'ab');"
       " sys.stdin.read()", str(path)], stdin=subprocess.PIPE)
  try:
    while not wandb_files.writers([path]):  # it has opened the file
      assert holder.poll() is None
      time.sleep(0.01)
    with pytest.raises(RuntimeError, match=(
        rf"^process {holder.pid} \(an earlier attempt's wandb-core\) still"
        rf" writes the run's files after 0 s; .* \(kill {holder.pid}\)")):
      wandb_files.wait_for_writers([path], timeout=0)
  finally:
    holder.communicate(timeout=30)  # its stdin closed: it ends
  wandb_files.wait_for_writers([path], timeout=0)
  path.write_bytes(b"SQLite format 3\0")
  with pytest.raises(ValueError, match="not a W&B run file of store version"
                     " 0 .*; looper reads the files of the wandb its extra"
                     r" pins: pip install 'looper\[wandb\]'$"):
    wandb_files.records(path)
