"""One rule for "best": the same table of cases through all three callers.

The callers: the best checkpoint and early stop (eval_action.EvalAction),
the HParams table's best column (hparams.Table) and `looper runs`
(runs.summarize). Each case's answer is written by hand.
"""

import json
import math

import pytest

from looper import workdir
from looper.cli import runs
from looper.control import actions
from looper.options import best
from looper.control import eval_action
from looper.workdir import files
from looper.workdir import hparams
from looper.workdir import jsonl

NAN = math.nan

# (config.checkpoint section, eval metrics) -> the metric and mode ranked.
RULES = [
    ({"best_metric": "accuracy", "best_mode": "max"}, ["accuracy", "loss"],
     ("accuracy", "max")),
    ({"best_metric": "loss", "best_mode": "min"}, ["accuracy", "loss"],
     ("loss", "min")),
    ({"best_metric": "f1"}, ["f1", "loss"], ("f1", "max")),  # mode default
    ({"best_metric": "", "best_mode": "max"}, ["accuracy", "loss"],
     ("accuracy", "max")),  # not set: the accuracy if evaluated
    ({}, ["top5", "loss"], ("loss", "min")),  # else the loss
]

# (metric, mode, [(step, value)]) -> the best (step, value); None: none.
HISTORIES = [
    ("accuracy", "max", [(10, 0.5), (20, 0.7), (30, 0.7), (40, 0.6)],
     (20, 0.7)),  # of equal values the earliest
    ("loss", "min", [(10, 2.0), (20, 1.0), (30, 1.5)], (20, 1.0)),
    ("accuracy", "max", [(10, NAN), (20, 0.3), (30, NAN)], (20, 0.3)),
    ("loss", "min", [(10, 1.0), (20, NAN), (30, 0.5)], (30, 0.5)),
    ("loss", "min", [(10, NAN)], None),  # a NaN is never the best
]


class FakeEvaluator:
  def __init__(self, logs):
    self._logs = iter(logs)

  def evaluate(self):
    return next(self._logs)


class Recorder:
  """Stands in for Summaries (eval) and the Checkpointer (save_best)."""

  def __init__(self):
    self.best_saves = []

  def eval(self, step, logs):
    pass

  def save_best(self, step):
    self.best_saves.append(step)


def make_action(tmp_path, metric, mode, history, patience=0):
  logs = [{metric: v, "loss": 1.0} if metric != "loss" else {"loss": v}
          for _, v in history]
  record = Recorder()
  wd = workdir.Workdir(str(tmp_path))
  action = eval_action.EvalAction(
      FakeEvaluator(logs), record, checkpointer=record,
      history=files.JsonFile(wd.best_history, wd.checkpoints),
      best=best.Best(metric, mode), patience=patience)
  return action, record


@pytest.mark.parametrize("checkpoint, names, want", RULES)
def test_the_rule_of_a_run(checkpoint, names, want):
  assert best.Best.of(checkpoint, names) == best.Best(*want)
  table = hparams.Table.of(json.dumps({"checkpoint": checkpoint}), "{}",
                           names)
  assert table.best == best.Best(*want)


def test_without_best_metric_eval_sets_rank_the_monitor_set(tmp_path):
  """data.eval_splits: the monitor set's accuracy, else its loss; the
  HParams columns of each set (its loss last) and `looper runs` agree."""
  names = ["test/loss", "test/accuracy", "val/loss", "val/accuracy"]
  assert best.Best.of({}, names, "val") == best.Best("val/accuracy", "max")
  assert best.Best.of({}, ["val/loss", "val/f1"], "val") == best.Best(
      "val/loss", "min")
  config = {"data": {"eval_splits": {"val": "a", "test": "b"}},
            "eval": {"monitor_set": "test"}, "checkpoint": {}}
  table = hparams.Table.of(json.dumps(config), "{}", names)
  assert table.eval_names == ["test/accuracy", "test/loss", "val/accuracy",
                              "val/loss"]
  assert table.best == best.Best("test/accuracy", "max")
  wd = workdir.Workdir(str(tmp_path))
  with open(wd.config, "w") as f:
    json.dump(config, f)
  log = jsonl.MetricsLog(wd.metrics)
  log.start()
  for step, accuracy in [(10, 0.6), (20, 0.8), (30, 0.7)]:
    log.write("eval", step, {"test/accuracy": accuracy, "test/examples": 5,
                             "val/accuracy": 1 - accuracy, "val/examples": 4})
  row = runs.summarize(wd.root)
  assert list(row) == ["run", "step", "test/accuracy", "val/accuracy",
                       "best test/accuracy"]
  assert row["best test/accuracy"] == "0.8 @20"


@pytest.mark.parametrize("metric, mode, history, want", HISTORIES)
def test_the_best_checkpoint_is_saved_at_each_new_best(tmp_path, metric, mode,
                                                       history, want):
  action, record = make_action(tmp_path, metric, mode, history)
  for step, _ in history:
    action.evaluate(step)
  assert action.best == (None if want is None else (metric, *want))
  assert (record.best_saves[-1] if record.best_saves else None) == (
      want and want[0])


@pytest.mark.parametrize("metric, mode, history, want", HISTORIES)
def test_the_hparams_best_column(metric, mode, history, want):
  table = hparams.Table.of(
      json.dumps({"checkpoint": {"best_metric": metric, "best_mode": mode}}),
      "{}", [metric])
  best = None
  for _, value in history:
    best = table.eval_results({metric: value}, best).get(table.best_tag, best)
  assert best == (want and want[1])


@pytest.mark.parametrize("metric, mode, history, want", HISTORIES)
def test_the_looper_runs_best_column(tmp_path, metric, mode, history, want):
  wd = workdir.Workdir(str(tmp_path))
  with open(wd.config, "w") as f:
    json.dump({"checkpoint": {"best_metric": metric, "best_mode": mode}}, f)
  log = jsonl.MetricsLog(wd.metrics)
  log.start()
  for step, value in history:
    log.write("eval", step, {metric: value})
  row = runs.summarize(wd.root)
  assert row.get(f"best {metric}") == (
      want and f"{want[1]:.4g} @{want[0]}")


def test_looper_runs_ranks_by_the_rule_of_the_run(tmp_path):
  # No best_metric in config.json: the accuracy, as in the HParams table.
  wd = workdir.Workdir(str(tmp_path))
  log = jsonl.MetricsLog(wd.metrics)
  log.start()
  for step, accuracy, loss in [(10, 0.6, 1.0), (20, 0.8, 1.2), (30, 0.7, 0.9)]:
    log.write("eval", step, {"accuracy": accuracy, "loss": loss})
  row = runs.summarize(wd.root)
  assert row["best accuracy"] == "0.8 @20" and "best loss" not in row


def test_patience_ends_training_through_the_moment(tmp_path):
  history = [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.65), (50, 0.9)]
  action, _ = make_action(tmp_path, "accuracy", "max", history, patience=2)
  now = actions.Moment(0, 100)
  for step, _ in history[:4]:
    now.step = step
    action(now)
  assert now.ended == (
      "early stop at step 40: accuracy has not improved on 0.7 (step 20) in"
      " 2 evaluations (train.early_stop_patience=2)")
  # Resumed at step 30 (the history past it forgotten): patience is left.
  again = actions.Moment(30, 100)
  resumed, _ = make_action(tmp_path, "accuracy", "max", history, patience=2)
  resumed.resume(again)
  assert again.ended is None and resumed.best == ("accuracy", 20, 0.7)
  # Resumed at step 40 (history.json read back): patience ran out there.
  late = actions.Moment(40, 100)
  make_action(tmp_path, "accuracy", "max", history, patience=2)[0].resume(late)
  assert late.ended == now.ended
