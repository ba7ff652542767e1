"""The Controller: the outer loop's policy (when to train, act, stop, recover).

Synopsis (what `looper.run.run` assembles from a config)::

    controller = Controller(trainer, checkpointer, data=input, batch=batch,
                            total_steps=1000, steps_per_loop=100)
    controller.add_actions(report=[...], evaluate=[...], save=[...])
    controller.train()            # or train_and_eval(), evaluate(fn),
                                  # continuous_eval(fn, ...)

`train` / `train_and_eval`, from the step the trainer was restored to::

    now = Moment(step, total_steps)    # what every action is given
    for action in actions: action.start(now)   # also its on_start(now)
    while not (now.end or now.stopping):
      n = steps to the nearest of: steps_per_loop, total_steps and the
          next `every_steps` boundary of any action
      values, logs = trainer.train(n)  # fewer steps if a signal stopped it
      if a loss is NaN/inf, or the loop spikes (`spikes`: its largest
          loss above train.spike_factor x recent steps'): roll back (restore
          the last checkpoint, move the data on to where it was: its data
          since is skipped) up to train.nan_recovery_tries times, or raise
          FloatingPointError; else its losses join the recent ones
      now.stopped = the stop's reason, if the trainer stopped for one
      now.step, now.loop = the step reached, loop (its per-step values:
          the loss and what train_step adds; its logs: each of those
          values' mean over the loop, the trainer's logs, the learning
          rate, and per second over the loop's time: steps, examples,
          tokens and FLOPs; mfu = FLOP/s / peak, a peak a loop beats
          raised first: said once)
      for action in report + eval (train_and_eval only) + save actions:
        result[action.name] = action(now)   # if it fired and returned one
        now.spent[action.name] = the seconds it took

A stop is requested on the trainer (`trainer.stop.request(reason)`, e.g.
from a signal handler: looper.control.signals); an early end by an action
(`now.end_training(reason)`, e.g. early stopping). The Controller knows
nothing of tf.distribute or Keras: the Trainer runs steps, the
Checkpointer saves and restores, the data (`looper.data.input.Input`)
says and moves its position, actions do everything else. What it needs
of them is written down in `looper.control.surfaces` (looper's Trainer,
Checkpointer and Input have it; the tests' fakes too).
"""

import time
from typing import Callable, Sequence

from absl import logging
import numpy as np

from looper import errors
from looper.control import actions as actions_lib
from looper.control.surfaces import (BatchSurface, CheckpointerSurface,
                                   DataSurface, PeakSurface, SpikeSurface,
                                   TrainerSurface)
from looper.workdir import formats


def loop_length(step: int, total: int, steps_per_loop: int,
                boundaries: Sequence[int | None] = ()) -> int:
  """Steps until the next of: a loop's end, `total`, any boundary."""
  n = min(steps_per_loop, total - step)
  for boundary in boundaries:
    if boundary is not None and boundary > step:
      n = min(n, boundary - step)
  return n


class Controller:
  """Runs the modes; see the module doc for the loop.

  Args (all but the first two keyword-only):
    trainer: runs steps (`TrainerSurface`).
    checkpointer: saves and restores (`CheckpointerSurface`; used for
      `evaluate`, continuous eval and NaN roll-backs; saving itself is a
      save action).
    data: the train data's position (`DataSurface`), for roll-backs.
    batch: the batch's numbers (`BatchSurface`): examples per second.
    total_steps, steps_per_loop: `train.steps`, `train.steps_per_loop`
      (the value the trainer's loop was built for).
    report_actions, eval_actions, save_actions: run in this order after
      each loop; eval actions only in `train_and_eval`.
    nan_recovery_tries: `train.nan_recovery_tries`.
    spikes: which loops spike (`SpikeSurface`); None: none do.
    peak: the FLOP/s of the run's devices that `mfu` is the share of
      (`PeakSurface`: looper.measure.peak_flops.Peak); None: no mfu.
    writer: the run's writers, given to actions as `Moment.writer`
      (looper.workdir.summaries.Summaries.writer).
    model: the run's Keras model, given to actions as `Moment.model`.
    chief: whether this process is the chief (`Moment.chief`: an action
      not for all workers runs there only).
    clock: times each loop (steps_per_sec), injectable for tests.
  """

  def __init__(self, trainer: TrainerSurface,
               checkpointer: CheckpointerSurface, *, data: DataSurface,
               batch: BatchSurface, total_steps: int, steps_per_loop: int,
               report_actions: Sequence[actions_lib.Action] = (),
               eval_actions: Sequence[actions_lib.Action] = (),
               save_actions: Sequence[actions_lib.Action] = (),
               nan_recovery_tries: int = 0,
               spikes: SpikeSurface | None = None,
               peak: PeakSurface | None = None, writer=None,
               model=None, chief: bool = True,
               clock: Callable[[], float] = time.perf_counter):
    self.trainer = trainer
    self.checkpointer = checkpointer
    self.data, self.batch = data, batch
    self.total_steps = total_steps
    self.steps_per_loop = steps_per_loop
    self.report_actions, self.eval_actions, self.save_actions = [], [], []
    self.add_actions(report=report_actions, evaluate=eval_actions,
                     save=save_actions)
    self._nan_tries = nan_recovery_tries
    self._spikes = spikes
    self._peak = peak
    self._writer, self._model, self._chief = writer, model, chief
    self._above_peak = False  # said once that a loop beat the peak
    self._clock = clock

  def add_actions(self, *, report: Sequence[actions_lib.Action] = (),
                  evaluate: Sequence[actions_lib.Action] = (),
                  save: Sequence[actions_lib.Action] = ()) -> None:
    """Appends to the three groups."""
    self.report_actions += report
    self.eval_actions += evaluate
    self.save_actions += save

  # --- Modes ------------------------------------------------------------------

  def train(self) -> dict:
    """Trains to `total_steps`; returns {'step', 'train', 'eval'?, ...}."""
    return self._train(self.report_actions + self.save_actions)

  def train_and_eval(self) -> dict:
    """Trains, evaluating where the eval actions say (and at the end)."""
    return self._train(self.report_actions + self.eval_actions +
                       self.save_actions)

  def evaluate(self, evaluate: Callable[[int], dict],
               checkpoint: str | None = None) -> dict:
    """Evaluates `checkpoint` (default: the latest) once with
    `evaluate(step)` -> eval logs."""
    path = self.checkpointer.restore(checkpoint)
    if not path:
      raise errors.CheckpointError(
          f"--mode=eval found no checkpoint in {self.checkpointer.directory};"
          " train first, or point --workdir at a trained run")
    step = self.trainer.global_step
    return {"step": step, "checkpoint": path, "eval": evaluate(step)}

  def continuous_eval(self, evaluate: Callable[[int], dict], *,
                      timeout_secs: float, poll_secs: float = 1.0,
                      sleep: Callable[[float], None] = time.sleep) -> dict:
    """Evaluates each new checkpoint once with `evaluate(step)`, beside a
    training process.

    Stops after evaluating a checkpoint at `total_steps` or later, or when
    no new checkpoint appeared for `timeout_secs`.
    """
    done, result = set(), {"step": None, "evaluated": []}
    waited = 0.0
    while True:
      new = [p for p in self.checkpointer.all() if p not in done]
      for path in new:
        done.add(path)
        try:
          self.checkpointer.restore(path)
        except errors.CheckpointMissing:  # deleted by `keep`
          logging.warning("Skipped %s: deleted (checkpoint.keep) before it"
                          " could be evaluated", path)
          continue
        step = self.trainer.global_step
        result.update(step=step, checkpoint=path, eval=evaluate(step))
        result["evaluated"].append(step)
        if step >= self.total_steps:
          return result
      waited = 0.0 if new else waited + poll_secs
      if waited >= timeout_secs:
        logging.info("No new checkpoint in %s for eval.timeout_secs=%s;"
                     " stopping.", self.checkpointer.directory, timeout_secs)
        return result
      sleep(poll_secs)

  # --- The loop ---------------------------------------------------------------

  def _train(self, actions: list[actions_lib.Action]) -> dict:
    step = self.trainer.global_step
    result = {"step": step}
    if step >= self.total_steps:
      logging.info("Already at step %d of train.steps=%d; nothing to train.",
                   step, self.total_steps)
      return result
    stop = self.trainer.stop
    now = actions_lib.Moment(step, self.total_steps, agree=stop.agree,
                             writer=self._writer, model=self._model,
                             chief=self._chief)
    self._start(now, actions)
    tries = 0
    while not (now.end or now.stopping):
      n = loop_length(now.step, self.total_steps, self.steps_per_loop,
                      [a.boundary(now.step) for a in actions])
      start = self._clock()
      values, logs = self.trainer.train(n)
      seconds = max(self._clock() - start, 1e-9)
      losses = values["loss"]  # what the roll-back reads
      finite = np.isfinite(losses).all() and self.trainer.weights_finite
      spike = (self._spikes.spike(losses, now.step + 1)
               if finite and self._spikes else None)
      if not finite or spike:
        if tries >= self._nan_tries:
          raise self._blow_up(losses, now.step + 1, tries, spike)
        tries += 1
        now.step = self._roll_back(losses, now.step + 1, tries, spike)
        self._start(now, actions)
        continue
      if self._spikes and len(losses):  # before the save that keeps it
        self._spikes.add(losses)
      # The stop takes effect when the trainer reports it after a loop:
      # under multi-worker all workers agree on it there (same step).
      if stop.requested and now.step + len(losses) < self.total_steps:
        now.stopped = stop.reason
      now.loop = None
      if len(losses):  # zero if a stop came before the loop's first step
        rates = self._rates(len(losses), logs, seconds)  # before **logs
        means = {k: float(np.mean(v)) for k, v in values.items()}
        now.loop = actions_lib.Loop(now.step + 1, values, dict(
            **means, **logs, learning_rate=self.trainer.learning_rate(),
            **rates), seconds)
        now.step = now.loop.last_step
        result.update(step=now.step, train=now.loop.logs)
      self._act(actions, now, result)
    if now.stopping:
      logging.info("Stopped by %s at step %d; saved %s; rerun the same"
                   " command to resume.", now.stopped, now.step,
                   self.checkpointer.latest())
      result["stopped"] = now.stopped
    if now.ended:
      result["ended"] = now.ended
    return result

  def _rates(self, steps: int, logs: dict[str, float], seconds: float
             ) -> dict[str, float]:
    """A loop's speed over its own `seconds`; the work it did (`flops`,
    `tokens`) is taken out of `logs` and given as rates."""
    rates = dict(steps_per_sec=steps / seconds, examples_per_sec=(
        steps * self.batch.global_batch_size / seconds))
    if "tokens" in logs:
      rates["tokens_per_sec"] = logs.pop("tokens") / seconds
    if "flops" in logs:
      rates["flops_per_sec"] = logs.pop("flops") / seconds
      if self._peak:
        seen = rates["flops_per_sec"]
        if seen > self._peak.flops_per_sec:  # MFU above 1 is never shown
          before = self._peak.flops_per_sec
          done = self._peak.beaten(seen)
          if not self._above_peak:
            self._above_peak = True
            logging.warning("A loop ran at %s, above the peak MFU was of"
                            " (%s): %s", formats.flops(seen),
                            formats.flops(before), done)
        rates["mfu"] = seen / self._peak.flops_per_sec
    return rates

  def _start(self, now: actions_lib.Moment,
             actions: list[actions_lib.Action]) -> None:
    now.loop = None
    for action in actions:
      action.start(now)

  def _act(self, actions: list[actions_lib.Action], now: actions_lib.Moment,
           result: dict) -> None:
    """Runs the actions due after a loop; what they return goes to `result`
    under their names, the time each took to `now.spent`."""
    now.spent = {}
    for action in actions:
      if action.every_loop and now.loop is None:
        continue  # nothing ran: nothing to report
      if now.stopping and not (action.on_stop or action.every_loop):
        continue  # a stop is not the time to evaluate
      start = self._clock()
      value = action(now)
      now.spent[action.name] = self._clock() - start
      if value is not None:
        result[action.name] = value

  def _blow_up(self, losses: np.ndarray, first_step: int, tries: int,
               spike: str | None = None) -> Exception:
    """The one-line error for a NaN/inf loss or a spike (none was saved)."""
    latest = self.checkpointer.latest()
    kept = f"{latest} is kept" if latest else "no checkpoint was written"
    after = (f" after {tries} recoveries (train.nan_recovery_tries)"
             if tries else "")
    fixes = ("lower --config.optimizer.learning_rate or check the data",
             spike and "raise --config.train.spike_factor",
             latest and not self._nan_tries and  # a checkpoint to go back to
             "set --config.train.nan_recovery_tries=1 to roll back to it and"
             " skip this loop's data")
    return FloatingPointError(
        f"{spike or _what_blew_up(losses, first_step)}{after}; {kept}; " +
        ", or ".join(fix for fix in fixes if fix))

  def _roll_back(self, losses: np.ndarray, first_step: int, tries: int,
                 spike: str | None = None) -> int:
    """Restores the last checkpoint and skips the data that blew up (or
    spiked): the data stay at `data_position`, past the bad loop."""
    position = self.data.data_position
    path = self.checkpointer.restore()
    if not path:
      raise self._blow_up(losses, first_step, tries - 1, spike)
    self.data.seek(position)
    step = self.trainer.global_step
    # Said, then saved at once (a restart must not replay the bad data):
    # the save's "Saved" line follows the line that explains it.
    logging.warning(
        "%s; restored %s (step %d) and skipped the data up to global example"
        " %d (recovery %d of train.nan_recovery_tries=%d)",
        spike or _what_blew_up(losses, first_step), path, step,
        position, tries, self._nan_tries)
    self.checkpointer.save(step, force=True)
    return step


def _what_blew_up(losses: np.ndarray, first_step: int) -> str:
  bad = np.flatnonzero(~np.isfinite(losses))
  if bad.size:
    return f"train loss is {losses[bad[0]]} at step {first_step + bad[0]}"
  # Every loss was finite, but the last step's update was not.
  return (f"the weights are not finite after step"
          f" {first_step + len(losses) - 1}")
