"""The Workdir names every path a run writes, and only those.

The names themselves are written out by hand (what earlier runs wrote and
tests, docs and users read back); a short run of every mode then writes
nothing the Workdir does not name.
"""

import os

import pytest

from looper import run
from looper import workdir
from tests.fixtures import tiny


def test_the_names_are_those_runs_always_wrote():
  wd = workdir.Workdir("/runs/a")
  assert (wd.config, wd.lease, wd.metrics) == (
      "/runs/a/config.json", "/runs/a/lease.json", "/runs/a/metrics.jsonl")
  assert (wd.checkpoints, wd.best_checkpoints, wd.best_history) == (
      "/runs/a/checkpoints", "/runs/a/checkpoints/best",
      "/runs/a/checkpoints/best/history.json")
  assert wd.checkpoint_saves() == ("/runs/a/checkpoints",
                                   "/runs/a/checkpoints/best")
  assert wd.checkpoint_saves(2) == ("/runs/a/.worker2_checkpoints",
                                    "/runs/a/.worker2_checkpoints/best")
  assert (wd.train_events, wd.eval_events, wd.continuous_eval_events,
          wd.hparams_events) == ("/runs/a/train", "/runs/a/eval",
                                 "/runs/a/eval_continuous", "/runs/a/hparams")
  assert wd.profile == "/runs/a/train/plugins/profile"
  assert (wd.export, wd.export_version(500), wd.export_partial(500)) == (
      "/runs/a/export", "/runs/a/export/500", "/runs/a/export/.partial-500")


def test_object_store_paths_stay_urls():
  wd = workdir.Workdir("gs://bucket/sweep/a")
  assert wd.best_history == "gs://bucket/sweep/a/checkpoints/best/history.json"
  assert wd.export_version(7) == "gs://bucket/sweep/a/export/7"


def walk(root: str) -> set[str]:
  """Every file under `root`, and every directory holding none."""
  found = set()
  for directory, dirs, files in os.walk(root):
    found.update(os.path.join(directory, f) for f in files)
    if not dirs and not files:
      found.add(directory)
  return found


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_every_mode_writes_only_what_the_workdir_names(tmp_path):
  wd = workdir.Workdir(str(tmp_path / "run"))
  c = tiny.get_config()
  c.train.steps = 20
  c.checkpoint.best_metric = "accuracy"
  c.export.at_end = True
  c.profile.start_step, c.profile.num_steps = 10, 1
  run.run(c, wd.root, "train_and_eval")
  run.run(c, wd.root, "eval")
  c.eval.timeout_secs = 0
  run.run(c, wd.root, "continuous_eval")
  files = walk(wd.root)

  def under(directory):
    return {f for f in files if f.startswith(directory + os.sep)}

  # One training attempt: its goodput record (eval modes write none).
  named = ({wd.config, wd.metrics, wd.best_history, wd.goodput_attempt(1)} |
           under(wd.export_version(20)) | under(wd.profile))
  # Each events directory holds event files only; the checkpoint
  # directories TensorFlow's files (its `checkpoint` index, ckpt-<step>.*).
  for directory in (wd.train_events, wd.eval_events, wd.hparams_events,
                    wd.continuous_eval_events):
    events = {f for f in under(directory) if os.path.dirname(f) == directory}
    assert events and all(".tfevents." in f for f in events), directory
    named |= events
  for directory in (wd.checkpoints, wd.best_checkpoints):
    saved = {f for f in under(directory) if os.path.dirname(f) == directory
             and f != wd.best_history}
    assert {os.path.basename(f).split(".")[0] for f in saved} == {
        "checkpoint", "ckpt-20"}, directory
    named |= saved
  assert under(wd.profile) and under(wd.export_version(20))
  assert files == named
