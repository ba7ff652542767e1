"""Evaluation as an action: events, the best checkpoint and early stopping.

Synopsis::

    evaluator = evaluation.Evaluator(trainer, out, checkpointer=ckpt,
                                     best_metric="accuracy", best_mode="max",
                                     patience=3, end_training=ctl.end_training)
    logs = evaluator(step)        # evaluate, write eval/ events, track best
    evaluator.resume(step)        # after a restore: forget later evaluations

Best checkpoint: after each evaluation that improves `best_metric`, the
state is saved to `checkpoints/best/` (one kept, apart from the rolling
ones). Early stop: after `patience` evaluations in a row without
improvement, training ends at that step (saved like a last step).

The history of evaluated values lives in `checkpoints/best/history.json`
(written atomically, chief only) so both survive a restart. A run killed
after an evaluation but before the next checkpoint replays that evaluation;
`resume(step)` drops history entries past the restored step first, so a
replay is not counted twice.
"""

import json
import operator
import os
from typing import Callable

from absl import logging
import tensorflow as tf

from looper import checkpoint as checkpoint_lib
from looper import summaries as summaries_lib
from looper.errors import ConfigError


# `checkpoint.best_mode` -> is a value better than another?
BEST_MODES = {"max": operator.gt, "min": operator.lt}


def check_best_metric(best_metric: str, trainer) -> None:
  """`checkpoint.best_metric` must be one of the values evaluation reports."""
  names = ["loss"] + trainer.eval_metric_names
  if best_metric and best_metric not in names:
    raise ConfigError(
        f"config.checkpoint.best_metric={best_metric!r} is not an eval"
        f" metric; use one of {', '.join(names)}")


class Evaluator:
  """Evaluates the trainer's current state once per step (see module doc)."""

  def __init__(self, trainer, out: summaries_lib.Summaries, *,
               checkpointer: checkpoint_lib.Checkpointer,
               end_training: Callable[[str], None],
               best_metric: str = "", best_mode: str = "max",
               patience: int = 0, chief: bool = True):
    """`best_metric` must be an eval metric (see `check_best_metric`)."""
    self._trainer, self._out, self._checkpointer = trainer, out, checkpointer
    # What is tracked, and what happens when it stops improving.
    self._metric, self._mode, self._patience = best_metric, best_mode, patience
    self._end_training = end_training
    self._chief = chief
    self.last, self.last_step = None, None
    self._history = []  # [(step, value)] of best_metric, in step order
    if best_metric:
      self._path = os.path.join(checkpointer.directory, "best",
                                "history.json")
      if tf.io.gfile.exists(self._path):
        with tf.io.gfile.GFile(self._path) as f:
          saved = json.load(f)
        if (saved["metric"], saved["mode"]) == (best_metric, best_mode):
          self._history = [tuple(e) for e in saved["history"]]
        else:  # another criterion: its best is not this one's
          logging.warning("%s tracked %s (%s); starting over for %s (%s)",
                          self._path, saved["metric"], saved["mode"],
                          best_metric, best_mode)

  def __call__(self, step: int, loop=None) -> dict[str, float]:
    """Evaluates at `step` (once: a repeated call returns the last logs)."""
    del loop  # evaluation does not need the train loop's numbers
    if step != self.last_step:
      self.last, self.last_step = self._trainer.evaluate(), step
      self._out.eval(step, self.last)
      if self._metric:
        self._track(step, self.last[self._metric])
    return self.last

  def resume(self, step: int) -> None:
    """Forgets evaluations after `step` and ends training if patience ran out."""
    self._history = [(s, v) for s, v in self._history if s <= step]
    if self.last_step is not None and self.last_step > step:
      self.last, self.last_step = None, None  # to be evaluated again
    if self._patience and self._stale() >= self._patience:
      self._end(step)

  @property
  def best(self) -> tuple[str, int, float] | None:
    """(checkpoint.best_metric, its best step, value); None if untracked."""
    best = self._best()
    return (self._metric, *best) if best else None

  def _better(self, value: float, than: float) -> bool:
    return BEST_MODES[self._mode](value, than)

  def _best(self) -> tuple[int, float] | None:
    best = None
    for s, v in self._history:
      if best is None or self._better(v, best[1]):
        best = (s, v)
    return best

  def _stale(self) -> int:
    """Evaluations since the best one."""
    best = self._best()
    return 0 if best is None else sum(s > best[0] for s, _ in self._history)

  def _track(self, step: int, value: float) -> None:
    best = self._best()
    self._history.append((step, value))
    self._write()
    if best is None or self._better(value, best[1]):
      self._checkpointer.save_best(step)
      logging.info("New best %s=%.6g at step %d", self._metric, value, step)
    elif self._patience and self._stale() >= self._patience:
      self._end(step)

  def _end(self, step: int) -> None:
    best_step, best_value = self._best()
    reason = (f"early stop at step {step}: {self._metric} has not improved"
              f" on {best_value:.6g} (step {best_step}) in {self._stale()}"
              f" evaluations (train.early_stop_patience={self._patience})")
    logging.info(reason)
    self._end_training(reason)

  def _write(self) -> None:
    """Replaces history.json atomically (a crash leaves the old one)."""
    if not self._chief:
      return
    tf.io.gfile.makedirs(os.path.dirname(self._path))
    tmp = self._path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
      json.dump({"metric": self._metric, "mode": self._mode,
                 "history": self._history}, f)
    tf.io.gfile.rename(tmp, self._path, overwrite=True)
