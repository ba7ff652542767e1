"""Which of a run's evaluations is its best: one rule (`Best`) for every reader.

Synopsis::

    rule = best.Best("accuracy", "max")      # checkpoint.best_metric/_mode
    rule.better(0.91, than=0.90)             # True; a NaN beats nothing
    rule.first_best([(100, 0.8), (200, 0.9)])  # (200, 0.9)
    best.Best.of(config_json["checkpoint"], eval_names)  # a run's rule
    best.Best.of({}, ["val/loss", "val/accuracy"], eval_set="val")
    best.check_best_metric("val/accuracy", evaluator.metric_names)

The same rule picks the best checkpoint and counts early stopping's
patience (looper.control.eval_action), and fills the best columns of
TensorBoard's HParams table (looper.workdir.hparams) and of `looper runs`.
"""

import dataclasses
import math
import operator
from typing import Iterable, Mapping

from looper.data import splits
from looper.errors import ConfigError


# `checkpoint.best_mode` -> is a value better than another?
BEST_MODES = {"max": operator.gt, "min": operator.lt}


def check_best_metric(best_metric: str, metric_names: list[str]) -> None:
  """`checkpoint.best_metric` must be one of the values evaluation reports
  (`metric_names`: the Evaluator's; with eval sets, '<set>/<metric>')."""
  if best_metric and best_metric not in metric_names:
    raise ConfigError(
        f"config.checkpoint.best_metric={best_metric!r} is not an eval"
        f" metric; use one of {', '.join(metric_names)}")


@dataclasses.dataclass(frozen=True)
class Best:
  """Which of a run's evaluations is its best: an eval metric, a direction."""
  metric: str
  mode: str = "max"  # a key of BEST_MODES

  @classmethod
  def of(cls, checkpoint: Mapping, eval_names: Iterable[str],
         eval_set: str = "") -> "Best":
    """The rule of a run, from its config's `checkpoint` section (as in
    config.json): `best_metric` and `best_mode` if set; else the accuracy
    (max) if it is evaluated; else the loss (min), of `eval_set` (with
    data.eval_splits, the monitor set: looper.data.splits)."""
    if checkpoint.get("best_metric"):
      return cls(checkpoint["best_metric"], checkpoint.get("best_mode", "max"))
    accuracy = splits.metric_name(eval_set, "accuracy")
    if accuracy in eval_names:
      return cls(accuracy, "max")
    return cls(splits.metric_name(eval_set, "loss"), "min")

  def better(self, value: float, than: float | None) -> bool:
    """Whether `value` beats `than` (None: no value yet). A NaN beats
    nothing, and any number beats a NaN."""
    if math.isnan(value):
      return False
    if than is None or math.isnan(than):
      return True
    return BEST_MODES[self.mode](value, than)

  def first_best(self, evaluations: Iterable[tuple[int, float]]
                 ) -> tuple[int, float] | None:
    """The best (step, value) of `evaluations` in step order; of equal
    values the earliest; None if there is none (or only NaNs)."""
    best = None
    for step, value in evaluations:
      if self.better(value, best[1] if best else None):
        best = (step, value)
    return best
