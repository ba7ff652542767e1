"""Evaluation as an action: events, the best checkpoint and early stopping.

Synopsis::

    evaluate = eval_action.EvalAction(
        evaluator, out, checkpointer=ckpt,
        history=files.JsonFile(wd.best_history, wd.checkpoints),
        best=best.Best("accuracy", "max"), patience=3)
    logs = evaluate.evaluate(step)  # evaluate, write eval/ events, track best
    # As a train_and_eval action: evaluate(moment), and on (re)start
    # evaluate.resume(moment): forget evaluations past moment.step.

Which evaluation is the best is `looper.options.best.Best`'s rule.

Best checkpoint: after each evaluation that improves `best.metric`, the
state is saved to `checkpoints/best/` (one kept, apart from the rolling
ones). Early stop: after `patience` evaluations in a row without
improvement, the action ends training at that step (`Moment.end_training`;
saved like a last step).

The history of evaluated values lives in `checkpoints/best/history.json`
(replaced whole, chief only) so both survive a restart. A run killed
after an evaluation but before the next checkpoint replays that evaluation;
`resume` drops history entries past the restored step first, so a replay
is not counted twice.
"""

from absl import logging

from looper.options.best import Best
from looper.workdir import files


class EvalAction:
  """Evaluates the trainer's current state once per step (see module doc).

  Args:
    evaluator: a `looper.train.evaluator.Evaluator`.
    out: the run's `looper.workdir.summaries.Summaries` (eval events).
    checkpointer: its `looper.workdir.checkpoint.Checkpointer` (the best one).
    history: the history file (`Workdir.best_history`).
    best: what is tracked (its metric must be an eval metric, see
      `check_best_metric`); None: no best checkpoint, no early stop.
    patience: evaluations without improvement that end training (0: never).
    chief: whether this process writes the history file.
  """

  def __init__(self, evaluator, out, *, checkpointer, history: files.JsonFile,
               best: Best | None = None, patience: int = 0,
               chief: bool = True):
    self._evaluator, self._out = evaluator, out
    self._checkpointer = checkpointer
    self._best_rule, self._patience = best, patience
    self._file = history
    self._chief = chief
    self.last, self.last_step = None, None
    self._history = []  # [(step, value)] of best.metric, in step order
    saved = history.read() if best else None
    if saved is not None:
      if Best(saved["metric"], saved["mode"]) == best:
        self._history = [tuple(e) for e in saved["history"]]
      else:  # another criterion: its best is not this one's
        logging.warning("%s tracked %s (%s); starting over for %s (%s)",
                        history.path, saved["metric"], saved["mode"],
                        best.metric, best.mode)

  def evaluate(self, step: int) -> dict[str, float]:
    """Evaluates at `step` (once: a repeated call returns the last logs)."""
    if step != self.last_step:
      self.last, self.last_step = self._evaluator.evaluate(), step
      self._out.eval(step, self.last)
      if self._best_rule:
        self._track(step, self.last[self._best_rule.metric])
    return self.last

  def __call__(self, now) -> dict[str, float]:
    """The train_and_eval action: evaluates at `now.step` (an
    `actions.Moment`), and ends training there if patience ran out."""
    logs = self.evaluate(now.step)
    self._end_if_stale(now)
    return logs

  def resume(self, now) -> None:
    """Forgets evaluations after `now.step` and ends training there if
    patience ran out."""
    self._history = [(s, v) for s, v in self._history if s <= now.step]
    if self.last_step is not None and self.last_step > now.step:
      self.last, self.last_step = None, None  # to be evaluated again
    self._end_if_stale(now)

  @property
  def best(self) -> tuple[str, int, float] | None:
    """(checkpoint.best_metric, its best step, value); None if untracked."""
    best = self._best()
    return (self._best_rule.metric, *best) if best else None

  def _best(self) -> tuple[int, float] | None:
    if self._best_rule is None:
      return None
    return self._best_rule.first_best(self._history)

  def _stale(self) -> int:
    """Evaluations since the best one."""
    best = self._best()
    return 0 if best is None else sum(s > best[0] for s, _ in self._history)

  def _track(self, step: int, value: float) -> None:
    best = self._best()
    self._history.append((step, value))
    self._write()
    if self._best_rule.better(value, best[1] if best else None):
      self._checkpointer.save_best(step)
      logging.info("New best %s=%.6g at step %d", self._best_rule.metric,
                   value, step)

  def _end_if_stale(self, now) -> None:
    if not (self._patience and self._stale() >= self._patience):
      return
    best_step, best_value = self._best()
    reason = (f"early stop at step {now.step}: {self._best_rule.metric} has"
              f" not improved on {best_value:.6g} (step {best_step}) in"
              f" {self._stale()} evaluations"
              f" (train.early_stop_patience={self._patience})")
    logging.info(reason)
    now.end_training(reason)

  def _write(self) -> None:
    """Replaces history.json whole (a crash leaves the old one)."""
    if self._chief:
      self._file.write({"metric": self._best_rule.metric,
                        "mode": self._best_rule.mode,
                        "history": self._history})
