"""Keras callbacks as the Controller's actions, called as fit() calls them.

Synopsis (what `looper.run.Run._build_callbacks` and `_build_actions` do)::

    c.callbacks = [keras.callbacks.EarlyStopping("val_accuracy", patience=3),
                   keras.callbacks.CSVLogger("/tmp/run/epochs.csv")]
    # or c.callbacks = "my_module:callbacks": callbacks(config) -> a list

    calls = callbacks.build(config, config.callbacks, model=trainer.model,
                            optimizer=trainer.optimizer,
                            rate_scale=trainer.learning_rate_scale,
                            metrics=trainer.train_metrics, chief=True,
                            every_steps=500, total_steps=2000,
                            eval_batch_size=256, monitor="")
    checkpointer = Checkpointer(..., {**trainer.checkpoint_items(),
                                      **calls.checkpoint_items()})
    groups = calls.actions(eval_logs=evaluation.evaluate,
                           latest=checkpointer.latest)
    report = [*standard, *groups.report]
    evaluate = [*groups.before_eval, eval, *groups.after_eval]
    save = [*groups.before_save, checkpoint, *groups.after_save, ...]

The protocol of `fit(steps_per_execution=K)` (keras/src/backend/tensorflow/
trainer.py), K being train.steps_per_loop and an epoch an evaluation
period (eval.every_steps; the whole run if 0), in the mode `train` too::

    set_model(model); set_params({"verbose": 0, "epochs", "steps"})
    on_train_begin()
    on_epoch_begin(epoch)                # epoch: the epochs ended before
    each loop (i: the steps of the epoch before it):
      on_train_batch_begin(i)            # after the previous loop's save
      on_train_batch_end(i + K - 1, logs)  # loss and train metrics since
                                         # the epoch began (as fit's)
    at an evaluation:
      on_test_begin(); on_test_batch_begin(0)         # before it, and
      on_test_batch_end(n - 1, logs); on_test_end(logs)  # after: one pass
    on_epoch_end(epoch, logs)            # train logs + val_<eval metric>,
                                         # before the step's checkpoint
    on_train_end(logs)                   # after the last save (a stop too)

`model` is the run's model seen through `ModelView`: `model.optimizer`
is the run's optimizer (its rate settable: `OptimizerView`) and
`model.stop_training` ends training at that step on every worker (as
`now.end_training`: evaluated, saved, and a rerun stays ended), neither
stored on the model, so its checkpoint and export stay the model's own.
Every worker calls the callbacks on the same logs; file writers (CSVLogger,
or a callback with `chief_only = True`) only the chief's.

What survives a restart is saved with the checkpoint, as the state at that
step (`looper.control.callback_state`): the epoch count, the train logs since
the epoch began, the learning-rate scale, the counts of EarlyStopping and
ReduceLROnPlateau (callback_state.SAVED) and the attributes a callback
names in its `checkpointed` tuple; a CSVLogger's file drops the rows
written after it. A resumed run calls on_train_begin, then sets the saved
state; an epoch the checkpoint fell inside does not begin again. With
several eval sets, on_epoch_end has each as '<set>/<metric>' and the
monitor set (eval.monitor_set) as 'val_<metric>' (`val_logs`), which
on_test_end has. A callback that raises ends the run in one line naming it and its method;
the last checkpoint is kept. The top-level field `callbacks` is declared
here (`config()`).
"""

import dataclasses
import math
from typing import Callable

import keras
import ml_collections

from looper import errors
from looper import fields
from looper import references
from looper.data import splits
from looper.control import actions as actions_lib
from looper.control import callback_state
from looper.control import keras_views

# Callbacks that do a job looper does itself, against its contracts; the
# error names what does it.
_CHECKPOINTS = ("looper saves checkpoints itself: checkpoint.every_steps or"
                " every_secs, checkpoint.best_metric keeps the best,"
                " export.at_end writes a SavedModel")
REFUSED = {
    "BackupAndRestore": "looper resumes from the workdir's last checkpoint"
                        " when the same command runs again (checkpoint."
                        "every_steps, checkpoint.every_secs)",
    "ModelCheckpoint": _CHECKPOINTS,
    "OrbaxCheckpoint": _CHECKPOINTS,
    "ProgbarLogger": "looper prints a progress line after each loop"
                     " (looper.run.run(..., verbose=False): none)",
    "TensorBoard": "looper writes TensorBoard events itself: tensorboard"
                   " --logdir=WORKDIR",
}


def build(config, value, **rest) -> "Callbacks":  # pylint: disable=redefined-outer-name
  """config.callbacks (`value`: a list, or a factory `f(config) -> list`
  or its 'module:name') checked, one line each (none: no actions); the
  config is read by nothing but that factory. The rest (`rest`): as
  `Callbacks` takes them.

  Raises:
    ConfigError: the factory raised, an entry is no keras.callbacks.Callback,
      or it is REFUSED.
  """
  if isinstance(value, str) and value:
    value = references.resolve(value, "callbacks")
  if callable(value) and not isinstance(value, keras.callbacks.Callback):
    try:
      value = value(config)
    except Exception as e:  # pylint: disable=broad-except
      name = getattr(value, "__qualname__", repr(value))
      raise errors.ConfigError(
          f"config.callbacks: {name}(config) raised {type(e).__name__}:"
          f" {errors.first_line(e)}; fix it, or give config.callbacks a list"
          ) from e
  if isinstance(value, keras.callbacks.Callback):
    value = [value]
  if not isinstance(value, (list, tuple)):
    raise errors.ConfigError(
        f"config.callbacks={value!r}: give a list of keras.callbacks.Callback"
        " objects, or a 'module:name' of a function(config) returning one")
  for i, callback in enumerate(value):
    if not isinstance(callback, keras.callbacks.Callback):
      raise errors.ConfigError(
          f"config.callbacks[{i}]={callback!r} is not a keras.callbacks."
          "Callback; give Callback objects (subclass it for your own)")
    for cls in type(callback).__mro__:
      if cls.__module__.startswith("keras") and cls.__name__ in REFUSED:
        raise errors.ConfigError(
            f"config.callbacks[{i}]={type(callback).__name__}: "
            f"{REFUSED[cls.__name__]}; remove it from config.callbacks")
  return Callbacks(list(value), **rest)


@dataclasses.dataclass
class Groups:
  """The callbacks' actions, by where they go among the standard ones."""
  report: list = dataclasses.field(default_factory=list)  # every loop
  before_eval: list = dataclasses.field(default_factory=list)
  after_eval: list = dataclasses.field(default_factory=list)
  before_save: list = dataclasses.field(default_factory=list)  # epoch end
  after_save: list = dataclasses.field(default_factory=list)  # next loop


class _EveryCall(actions_lib.Action):
  """Fires after every loop, one cut to no step by a stop too."""

  def due(self, now: actions_lib.Moment) -> bool:
    return True


class Callbacks:
  """Calls `callbacks` as fit() does (see module doc).

  Args:
    callbacks: keras.callbacks.Callback objects (checked by `build`).
    model, optimizer: the run's (`model` and `model.optimizer` to them).
    rate_scale: the factor on the schedule `model.optimizer.learning_rate`
      sets (`OptimizerView`; the Trainer's `learning_rate_scale`), saved
      with their state.
    metrics: the train metrics (looper.options.metrics.Metrics): the
      logs' names, the directions of a monitor's 'auto' mode.
    chief: whether this process writes files (others skip CSVLogger and
      callbacks with `chief_only = True`).
    every_steps: eval.every_steps: an epoch's steps (0: the whole run).
    total_steps: train.steps.
    eval_batch_size: eval.batch_size (the eval pass' steps, from its
      examples).
    monitor: the eval set seen as fit's validation data (`val_logs`).
  """

  def __init__(self, callbacks: list, *, model, optimizer, rate_scale,
               metrics, chief: bool, every_steps: int, total_steps: int,
               eval_batch_size: int, monitor: str = ""):
    self._all = callbacks
    self._active = [c for c in callbacks if chief or not (
        isinstance(c, keras.callbacks.CSVLogger) or
        getattr(c, "chief_only", False))]
    self._chief = chief
    self._every = every_steps
    self._eval_batch, self._monitor = eval_batch_size, monitor
    self.model = keras_views.ModelView(  # what each callback's self.model is
        model, keras_views.OptimizerView(optimizer, rate_scale))
    self._params = {"verbose": 0, "epochs": math.ceil(
        total_steps / every_steps) if every_steps else 1,
                    "steps": every_steps or total_steps}
    self._state = callback_state.State(
        callbacks, rate_scale, metrics.names) if callbacks else None
    self._metrics = metrics
    self._eval_logs = self._latest = None  # given by `actions`
    self._begun = False  # on_train_begin was called
    self._val = None  # (step, eval logs as val_*) of the last evaluation
    self._step = 0  # where the run is, for an error's line
    self._asked = None  # which callback set model.stop_training

  def checkpoint_items(self) -> dict:
    """What a checkpoint holds of them: saved, and restored before `start`."""
    return {"callbacks": self._state.trackables()} if self._all else {}

  def actions(self, *, eval_logs: Callable[[int], dict],
              latest: Callable[[], str | None]) -> Groups:
    """The actions calling the callbacks. `eval_logs(step)`: the logs of the
    evaluation at `step` (the eval action's); `latest()`: the newest
    checkpoint once a save in flight ended, for an error's line."""
    if not self._all:
      return Groups()
    self._eval_logs, self._latest = eval_logs, latest
    # Every worker's: callbacks run everywhere, and agree on a stop.
    every = dict(all_workers=True, name="callbacks")
    period = dict(every_steps=self._every, at_end=True, **every)
    return Groups(
        report=[actions_lib.Action(self._batch_end, every_loop=True,
                                   on_start=self._start, **every)],
        before_eval=[actions_lib.Action(self._test_begin, **period)],
        after_eval=[actions_lib.Action(self._test_end, **period)],
        before_save=[actions_lib.Action(self._epoch_end, **period)],
        after_save=[_EveryCall(self._next, on_stop=True, **every)])

  # --- The actions ------------------------------------------------------------

  def _start(self, now: actions_lib.Moment) -> None:
    """Training starts, resumes or rolls back at `now.step`."""
    self._step = now.step
    state = self._state
    saved = state.load(now.step)
    if state.ended:  # a callback ended this run: a rerun stays ended
      now.end_training(state.ended)
      return
    if not self._begun:
      if self._chief and saved:
        for c in self._active:
          if isinstance(c, keras.callbacks.CSVLogger):
            callback_state.trim_csv(c, state.epoch)
      # At the start, not before: config.json holds the mode as given.
      callback_state.resolve_modes(self._active, self._metrics)
      self._each("set_model", self.model)
      self._each("set_params", self._params)
      self._each("on_train_begin", {})
      self._begun = True
    state.set_callbacks()  # after on_train_begin, which resets them
    self._begin_loop(now)

  def _batch_end(self, now: actions_lib.Moment) -> None:
    loop, state = now.loop, self._state
    self._step = now.step
    state.add(loop.values, loop.logs)
    self._each("on_train_batch_end", loop.last_step - 1 - state.start,
               state.train_logs())
    self._stop_if_asked(now)

  def _test_begin(self, now: actions_lib.Moment) -> None:
    self._each("on_test_begin", {})
    self._each("on_test_batch_begin", 0, {})

  def _test_end(self, now: actions_lib.Moment) -> None:
    logs = self._eval_logs(now.step)  # the evaluation just run
    watched = splits.set_logs(logs, self._monitor)  # fit's validation logs
    steps = math.ceil(watched.pop("examples", 0) / self._eval_batch)
    self._each("on_test_batch_end", max(steps - 1, 0), dict(watched))
    self._each("on_test_end", dict(watched))
    self._val = now.step, val_logs(logs, self._monitor)

  def _epoch_end(self, now: actions_lib.Moment) -> None:
    state = self._state
    val = self._val[1] if self._val and self._val[0] == now.step else {}
    state.last_logs = {**state.train_logs(), **val}
    self._each("on_epoch_end", state.epoch, dict(state.last_logs))
    state.next_epoch(now.step)
    self._stop_if_asked(now)

  def _next(self, now: actions_lib.Moment) -> None:
    """After the step's save: the next loop's begin, or the end."""
    if now.end or now.stopping:
      if self._begun:
        self._each("on_train_end", dict(self._state.last_logs or {}))
    else:
      self._begin_loop(now)

  # --- Helpers ----------------------------------------------------------------

  def _begin_loop(self, now: actions_lib.Moment) -> None:
    if now.step == self._state.start:
      self._each("on_epoch_begin", self._state.epoch, {})
    self._each("on_train_batch_begin", now.step - self._state.start, {})

  def _stop_if_asked(self, now: actions_lib.Moment) -> None:
    """`model.stop_training`, or-ed over the workers (every worker calls
    this at the same steps), ends training here; then the state is kept
    (the checkpoint at this step holds it)."""
    if now.agree(self.model.stop_training) and not now.end:
      now.end_training(self._asked or "a Keras callback on another worker"
                       " set model.stop_training")
      self._state.ended = now.ended
    self._state.keep()

  def _each(self, method: str, *args) -> None:
    """`method` of each active callback, in order; one line if one raises."""
    for callback in self._active:
      try:
        getattr(callback, method)(*args)
      except Exception as e:  # pylint: disable=broad-except
        latest = self._latest() if self._latest else None
        kept = f"{latest} is kept" if latest else "no checkpoint was written"
        raise errors.ConfigError(
            f"config.callbacks: {type(callback).__name__}.{method} raised"
            f" {type(e).__name__} at step {self._step}:"
            f" {errors.first_line(e)}; {kept}; fix the callback or remove"
            " it from config.callbacks") from e
      if self.model.stop_training and not self._asked:
        self._asked = (f"{type(callback).__name__}.{method} set"
                       f" model.stop_training at step {self._step}")


def val_logs(logs: dict, monitor: str = "") -> dict:
  """Eval logs as on_epoch_end has them: fit's 'val_<metric>' of the
  monitor set (`looper.data.splits.monitor_set`: '' for data.eval_split's
  one set) and, of several sets, every '<set>/<metric>' too; no example
  counts (not metrics: fit has none)."""
  val = {f"val_{k}": v for k, v in splits.set_logs(logs, monitor).items()}
  every = logs if monitor else {}
  return {k: v for k, v in {**every, **val}.items()
          if k.rsplit("/", 1)[-1] not in ("examples", "val_examples")}


def config() -> ml_collections.ConfigDict:
  """The top-level field `callbacks`: its default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # Keras callbacks as fit() calls them: a list, or a factory as for actions.
  c.callbacks = fields.object_field(())
  return c
