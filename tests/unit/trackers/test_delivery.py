"""Delivery: each point sent once a checkpoint covers it, none twice, none
lost, across restarts, a kill in the middle of a send and a failing
service; against a fake service that keeps every point it is sent, as
MLflow does (the real one: test_mlflow.py)."""

import logging

import numpy as np
import pytest

from looper import workdir as workdir_lib
from looper.trackers import delivery
from looper.workdir import jsonl
from looper.workdir import spool


class Service:
  """Every point sent, kept (a step sent twice is there twice)."""

  def __init__(self):
    self.points = []  # (name, step, value, kind)
    self.params, self.statuses, self.down = {}, [], False

  def pairs(self):
    return sorted((name, step) for name, step, _, _ in self.points)


class Fake(delivery.Tracker):
  name = "fake"

  def __init__(self, wd, service):
    super().__init__(wd)
    self.service = service

  def _open(self, run_id, params):
    self._params(params)
    return run_id or "run-1"

  def _params(self, params):
    self.service.params.update(params)

  def _send(self, points):
    if self.service.down:
      raise ConnectionError("connection refused\nsecond line")
    self.service.points += [(k, p.step, v, p.kind) for p in points
                            for k, v in p.values.items()]

  def _held(self, points):
    return {(k, s) for k, s, _, _ in self.service.points}

  def _finish(self, status):
    if self.service.down:
      raise ConnectionError("connection refused")
    self.service.statuses.append(status)


def loops(wd, tracker, steps):
  """Train lines of `steps` in metrics.jsonl and the tracker, as the run's
  train writer writes them (looper.workdir.summaries)."""
  log = jsonl.MetricsLog(wd.metrics)
  for step in steps:
    logs = {"loss": 1 / step, "accuracy": step / 100}
    log.write("train", step, logs)
    tracker.write_scalars(step, {f"train/{k}": v for k, v in logs.items()})


def expected(steps):
  return sorted((f"train/{k}", s) for s in steps for k in ("accuracy", "loss"))


def test_a_point_waits_for_a_complete_checkpoint(tmp_path):
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()
  tracker = Fake(wd, service)
  tracker.open({"train.steps": "40"})
  tracker.start(0)
  loops(wd, tracker, [10, 20])
  tracker.deliver(None)  # no checkpoint yet
  assert service.points == []
  tracker.deliver(10)
  assert service.pairs() == expected([10])
  tracker.write_images(20, {"samples": [[[[0]]]]})
  tracker.deliver(20)
  assert service.pairs() == sorted(expected([10, 20]) + [("samples", 20)])
  line = tracker.close(20, figures={"hparams/train_loss": 0.05},
                       status="FINISHED")
  assert ("hparams/train_loss", 20, 0.05, "figures") in service.points
  assert line == "run run-1: 4 writes sent"
  assert service.statuses == ["FINISHED"]
  assert service.params == {"train.steps": "40"}


def test_a_restart_sends_what_the_killed_run_had_not_and_nothing_twice(
    tmp_path):
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()
  first = Fake(wd, service)
  first.open({})
  first.start(0)
  loops(wd, first, [10, 20, 30])
  first.deliver(10)
  # Killed after its checkpoint at 20 but before that delivery; the rerun
  # restores 20 and cuts metrics.jsonl back to it (Summaries.purge_after).
  jsonl.MetricsLog(wd.metrics).truncate_after(20)
  rerun = Fake(wd, service)
  rerun.open({})
  rerun.start(20)
  assert service.pairs() == expected([10, 20])
  [replayed] = [v for k, s, v, _ in service.points if (k, s) ==
                ("train/loss", 20)]
  assert replayed == 1 / 20  # metrics.jsonl's value
  loops(wd, rerun, [30, 40])
  rerun.close(40, figures=None, status="FINISHED")
  assert service.pairs() == expected([10, 20, 30, 40])


def test_a_kill_mid_send_leaves_out_what_the_service_got(tmp_path):
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()
  first = Fake(wd, service)
  first.open({})
  first.start(0)
  loops(wd, first, [10, 20])
  first.deliver(10)
  # The send of step 20 was under way (`sending` written) and half of it
  # arrived when the process died.
  saved = first._file.read()  # pylint: disable=protected-access
  assert saved["delivered"] == 10 and saved["sending"] is None
  first._file.write({**saved, "sending": [20, 20]})  # pylint: disable=protected-access
  service.points.append(("train/loss", 20, 1 / 20, "scalars"))
  rerun = Fake(wd, service)
  rerun.open({})
  rerun.start(20)
  assert service.pairs() == expected([10, 20])  # each once
  assert rerun._file.read()["sending"] is None  # pylint: disable=protected-access


def test_a_failing_service_never_stops_training_and_the_rerun_catches_up(
    tmp_path, caplog):
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()
  tracker = Fake(wd, service)
  tracker.open({})
  tracker.start(0)
  loops(wd, tracker, [10])
  tracker.deliver(10)
  service.down = True
  loops(wd, tracker, [20, 30])
  with caplog.at_level(logging.WARNING):
    tracker.deliver(20)
    tracker.deliver(30)
    line = tracker.close(30, figures=None, status="FINISHED")
  # One line while it is away (its run's status too waits for the rerun).
  warned = [r.getMessage() for r in caplog.records if "fake:" in
            r.getMessage()]
  assert warned == [
      "fake: could not deliver (connection refused); training goes on, its"
      " writes are kept and sent again after the next checkpoint"]
  assert line == ("run run-1: 2 writes of steps 20-30 NOT delivered"
                  " (connection refused); rerun the same command to send"
                  " them (the workdir keeps them)")
  assert service.pairs() == expected([10])
  service.down = False  # the rerun: nothing to train, the rest delivered
  rerun = Fake(wd, service)
  rerun.open({})
  assert rerun.close(30, figures=None, status="FINISHED") == (
      "run run-1: 2 writes sent")
  assert service.pairs() == expected([10, 20, 30])
  assert service.statuses == ["FINISHED"]


def test_a_roll_back_drops_the_points_it_trains_again(tmp_path):
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()
  tracker = Fake(wd, service)
  tracker.open({})
  tracker.start(0)
  loops(wd, tracker, [10, 20, 30])
  tracker.start(20)  # a NaN roll-back to the checkpoint at 20
  jsonl.MetricsLog(wd.metrics).truncate_after(20)
  loops(wd, tracker, [30])
  tracker.deliver(30)
  assert service.pairs() == expected([10, 20, 30])


def test_final_figures_go_once(tmp_path):
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()
  for _ in range(2):  # the run, then a rerun that trains nothing
    tracker = Fake(wd, service)
    tracker.open({})
    tracker.close(40, figures={"goodput/goodput": 0.5}, status="FINISHED")
  assert service.pairs() == [("goodput/goodput", 40)]


@pytest.mark.parametrize("kind", ["train", "eval", "action"])
def test_a_replayed_line_is_named_as_it_was_written(tmp_path, kind):
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()
  jsonl.MetricsLog(wd.metrics).write(kind, 10, {"loss": 0.5})
  tracker = Fake(wd, service)
  tracker.open({})
  tracker.start(10)
  assert service.pairs() == [(jsonl.PREFIXES[kind] + "loss", 10)]


@pytest.mark.parametrize("held_on_send", [True, False])
def test_media_a_kill_took_are_sent_by_the_restart_once(tmp_path,
                                                        held_on_send):
  """Images and texts are in no metrics.jsonl: the spool keeps them until
  the service holds them (a send returned, or, for a tracker whose own
  process writes later (W&B), its run closed)."""
  wd, service = workdir_lib.Workdir(str(tmp_path)), Service()

  class Keeping(Fake):
    KEEPS = ("images", "texts")
    HELD_ON_SEND = held_on_send

  kept = spool.Spool(wd.tracker_media("fake"), wd.checkpoints)
  first = Keeping(wd, service)
  first.open({})
  first.start(0)
  for step in (10, 20, 30):
    loops(wd, first, [step])
    first.write_images(step, {"samples": np.full((1, 2, 2, 3), step)})
    first.write_texts(step, {"note": f"step {step}"})
  first.deliver(10)  # then a kill -9: steps 20 and 30 in memory only
  assert [e.step for e in kept.read()] == (
      [20, 20, 30, 30] if held_on_send else [10, 10, 20, 20, 30, 30])
  rerun = Keeping(wd, service)
  rerun.open({})
  rerun.start(20)  # restored at 20: step 30 is trained (written) again
  media = sorted((k, s) for k, s, _, kind in service.points
                 if kind != "scalars")
  assert media == [("note", 10), ("note", 20), ("samples", 10),
                   ("samples", 20)]  # each once
  [(_, _, pixels, _)] = [p for p in service.points if p[:2] == ("samples", 20)]
  assert np.array_equal(pixels, np.full((1, 2, 2, 3), 20))
  assert service.pairs() == sorted(expected([10, 20]) + media)
  assert [e.step for e in kept.read()] == ([] if held_on_send else [20, 20])
  rerun.close(20, figures=None, status="FINISHED")
  assert kept.read() == []
