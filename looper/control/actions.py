"""Periodic actions: what the Controller does between train loops, and when (public: `looper.Action`, `looper.Moment`).

Synopsis::

    def save(now):                   # now: a Moment (step, loop, stopping...)
      ckpt.save(now.step, sync=now.stopping)

    save = actions.Action(save, every_steps=1000, every_secs=600,
                          at_end=True, on_stop=True, all_workers=True)
    controller = Controller(trainer, ..., save_actions=[save])

    def log_samples(now):            # a user's: config.actions = [...]
      now.writer.write_images(now.step, {"samples": images(now.step)})
    looper.Action(log_samples, every_steps=500)

An action is a function of a `Moment` plus a trigger. It fires after a
train loop when any of these holds:
- `every_steps`: the loop crossed a multiple of it. The Controller also ends
  each loop exactly on the next such multiple (`boundary`), so step-based
  actions land on their step whatever `steps_per_loop` is;
- `every_secs`: that long has passed since it last fired (or since the run
  started), by `clock` (injectable, so tests need not sleep); under
  multi-worker the workers agree on it, so all fire at the same step;
- `every_loop`: after every loop (summaries, progress line);
- `at_end`: training ended (the last step, or an early stop);
- `on_stop`: training is stopping early on a signal (preemption).
`on_start(moment)`, if given, runs when training starts, resumes or rolls
back to `moment.step` (e.g. to forget what a killed run wrote past it).
Under multi-worker an action runs on the chief only (`fn` and `on_start`;
its trigger is kept on every worker, so `every_secs` agrees) unless
`all_workers=True` (what takes part in a collective: a save, an
evaluation).

The `Moment` is all an action is given and all it may change: the step,
the `Loop` just run (its first step, per-step values, logs, seconds), the
time each action before it took after that loop (`spent`), whether
training ends or stops there, `end_training(reason)` (an early stop),
`writer`, the run's writers (looper.workdir.writers: TensorBoard's train/,
metrics.jsonl, the experiment trackers) to write scalars, images,
histograms and texts through, and `model`, the run's Keras model.
What the function returns, if not None, is the mode's result under the
action's `name` (the last value: the evaluation's logs, the export's path).
New behaviour (export, a profiler window, an early stop) is a new action:
the Controller's loop does not change. A user's join the run's through
`config.actions` (`of_config`): after the evaluation, before the save, so
that what they write is covered by the checkpoint that follows. That
top-level field is declared here (`config()`).
"""

import dataclasses
import time
from typing import Any, Callable

import numpy as np

import ml_collections

from looper import errors
from looper import fields
from looper import references


@dataclasses.dataclass
class Loop:
  """One train loop's outcome, as the actions see it."""
  first_step: int  # the global step of each value's [0]
  # Each step's values by name: 'loss' (the global mean loss), then what
  # the Trainer's train_step adds (each summed over the replicas).
  values: dict[str, np.ndarray]
  logs: dict[str, float]  # the values' means, train metrics, rate, speed
  seconds: float = 0.0  # how long the loop took

  @property
  def losses(self) -> np.ndarray:
    """The global mean loss of each step."""
    return self.values["loss"]

  @property
  def last_step(self) -> int:
    return self.first_step + len(self.losses) - 1


@dataclasses.dataclass
class Moment:
  """Training as the actions see it after a loop (or at its start).

  The Controller keeps one per run of `train`: an early end one action
  asks for is seen by the actions after it (the save after the evaluation).
  """
  step: int  # the global step reached
  total_steps: int
  loop: Loop | None = None  # the loop just run; None: no step ran
  stopped: str | None = None  # the signal that stops training here
  ended: str | None = None  # why training ends before total_steps
  # Makes a per-process decision (a clock) the same on every worker.
  agree: Callable[[bool], bool] = bool
  # Seconds each action (by name) took after this loop, so far.
  spent: dict[str, float] = dataclasses.field(default_factory=dict)
  # The run's writers (a looper.workdir.writers.Writer; no-ops but on the
  # chief); None outside a run.
  writer: Any = None
  model: Any = None  # the run's Keras model; None outside a run
  chief: bool = True  # this process is the one that writes files

  @property
  def end(self) -> bool:
    """Training ends here: the last step, or an early end."""
    return self.step >= self.total_steps or self.ended is not None

  @property
  def stopping(self) -> bool:
    """A signal stops training here, before the last step (preemption)."""
    return self.stopped is not None

  def end_training(self, reason: str) -> None:
    """Ends training at this step as if it were the last one."""
    self.ended = reason


class Action:
  """Runs `fn(moment)` when its trigger says so (see module doc)."""

  def __init__(self, fn: Callable[[Moment], Any], *,
               every_steps: int = 0, every_secs: float = 0.0,
               every_loop: bool = False, at_end: bool = False,
               on_stop: bool = False,
               on_start: Callable[[Moment], None] | None = None,
               all_workers: bool = False,
               clock: Callable[[], float] = time.monotonic,
               name: str | None = None):
    self.name = name or getattr(fn, "__name__", type(fn).__name__)
    if every_steps < 0 or every_secs < 0:
      raise errors.ConfigError(
          f"looper.Action({self.name}): every_steps={every_steps} and"
          f" every_secs={every_secs} must be >= 0")
    if not (every_steps or every_secs or every_loop or at_end or on_stop):
      # Accepted, it would never run, and nothing would say so.
      raise errors.ConfigError(
          f"looper.Action({self.name}) has no trigger, so it would never"
          " run; give it every_steps=N, every_secs=S, every_loop=True,"
          " at_end=True or on_stop=True")
    self.fn = fn
    self.every_steps = every_steps
    self.every_secs = every_secs
    self.every_loop = every_loop
    self.at_end = at_end
    self.on_stop = on_stop
    self._on_start = on_start
    self.all_workers = all_workers
    self._clock = clock
    self._last_step = 0
    self._last_time = 0.0

  def start(self, now: Moment) -> None:
    """Resets the trigger at the step training starts (or resumes) from."""
    self._last_step = now.step
    self._last_time = self._clock()
    if self._on_start is not None and (self.all_workers or now.chief):
      self._on_start(now)

  def boundary(self, step: int) -> int | None:
    """The next step after `step` this action must land on, if step-based."""
    if not self.every_steps:
      return None
    return (step // self.every_steps + 1) * self.every_steps

  def due(self, now: Moment) -> bool:
    """Whether the action fires after a loop that ended at `now.step`.

    `now.agree` is called whenever `every_secs` is set, so that every
    worker calls it at the same point.
    """
    late = bool(self.every_secs) and now.agree(
        self._clock() - self._last_time >= self.every_secs)
    if ((now.end and self.at_end) or (now.stopping and self.on_stop) or
        self.every_loop):
      return True
    if self.every_steps and (now.step // self.every_steps !=
                             self._last_step // self.every_steps):
      return True
    return late

  def __call__(self, now: Moment) -> Any:
    """Fires if due; returns what `fn` returned (None if not due, or not
    run here: a chief's action on another worker)."""
    if not self.due(now):
      self._last_step = now.step
      return None
    result = self.fn(now) if self.all_workers or now.chief else None
    self._last_step = now.step
    self._last_time = self._clock()
    return result


def of_config(config) -> list[Action]:
  """The actions `config.actions` holds: a list of Actions, or a factory
  (a callable or a 'module:name' string) `f(config)` returning one; one
  line naming the field if it is something else."""
  value = config.actions
  if isinstance(value, str) or (callable(value) and
                                not isinstance(value, Action)):
    value = references.resolve(value, "actions")(config)
  if not (isinstance(value, (list, tuple)) and
          all(isinstance(a, Action) for a in value)):
    raise errors.ConfigError(
        f"config.actions={value!r}: give a list of looper.Action, or a"
        " factory f(config) returning one ('module:name' or a function)")
  return list(value)


def config() -> ml_collections.ConfigDict:
  """The top-level field `actions`: its default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # The user's looper.Actions beside looper's (README "Hooks of your own"):
  # a list, or a factory f(config) returning one (or its 'module:name').
  c.actions = fields.object_field(())
  return c
