"""W&B as the run's tracker, offline (no network here): a run and its rerun
write one W&B run (one id, two offline files) whose history holds exactly
metrics.jsonl's lines, an action's images, histogram and text at their
steps, the config with the changed field, and the final figures.

Read back from the offline files: wandb 0.31 ships no reader of them (its
`sync` is a Go binary), so `records` de-frames the file (LevelDB's log
format, W&B's header) and parses each record with wandb's own protobuf
classes. Not tested: online mode and `wandb sync` (no server), W&B's own
drop of a step below its last one, a failure mid-run (W&B sends in the
background and retries itself), a kill in the middle of a send (W&B
cannot say what it holds)."""

import json
import os
import struct
import tempfile

import numpy as np
import pytest

import looper
from looper import run
from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import jsonl
from tests.fixtures import needs
from tests.fixtures import private_home
from tests.fixtures import tiny
from tests.fixtures.configs import configured

# wandb makes two folders in the temp dir as it loads, removed at the
# interpreter's exit, which the test session skips (tests/conftest.py):
# they go in the session's private tree, removed at its end.
_TEMP, tempfile.tempdir = tempfile.tempdir, os.environ[private_home.ROOT_VAR]
try:
  wandb = needs.extra("wandb", "wandb")
finally:
  tempfile.tempdir = _TEMP
from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top,wrong-import-position

BLOCK, HEADER = 32768, 7  # LevelDB's log blocks; W&B's file header


def records(path):
  """The records of an offline run file, in order."""
  data, pos, parts, out = path.read_bytes(), HEADER, b"", []
  assert data[:4] == b":W&B"
  while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header
      pos += BLOCK - pos % BLOCK
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


def items(update) -> dict:
  return {i.key or "/".join(i.nested_key): json.loads(i.value_json)
          for i in update}


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_a_run_and_its_rerun_are_one_wandb_run_holding_metrics_jsonl(
    tmp_path, monkeypatch, caplog):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_PROJECT", "tiny")
  wd = workdir_lib.Workdir(str(tmp_path))

  def log_samples(now):
    now.writer.write_images(now.step, {"samples": np.zeros((2, 4, 4, 3))})
    now.writer.write_histograms(now.step, {"logits": np.arange(12.0)},
                                {"logits": 4})
    now.writer.write_texts(now.step, {"note": f"step {now.step}"})

  config = configured(tiny.get_config(), trackers="wandb", train__steps=30,
                      checkpoint__every_steps=10, eval__every_steps=10,
                      actions=[looper.Action(log_samples, every_steps=10)])
  run.run(config, wd.root, verbose=False)
  config.train.steps = 40
  with caplog.at_level("INFO"):
    run.run(config, wd.root)

  run_id = files.read_json(wd.tracker("wandb"))["run_id"]
  paths = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
  assert [p.name for p in paths] == [f"run-{run_id}.wandb"] * 2
  rows, configs, summary = {}, {}, {}
  for path in paths:
    for record in records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        assert record.run.run_id == run_id
      elif kind == "history":
        row = items(record.history.item)
        assert row["_step"] not in rows  # each step once
        rows[row["_step"]] = row
      elif kind == "config":
        configs.update(items(record.config.update))
      elif kind == "summary":
        summary.update(items(record.summary.update))
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
