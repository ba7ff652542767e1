"""Periodic actions: what the Controller does between train loops, and when.

Synopsis::

    save = actions.Action(lambda step, loop: ckpt.save(step),
                          every_steps=1000, every_secs=600, at_end=True,
                          on_stop=True)
    controller = Controller(trainer, ..., save_actions=[save])

An action is a function of (step, loop) plus a trigger. It fires after a
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
`on_start(step)`, if given, runs when training starts, resumes or rolls
back to `step` (e.g. to forget what a killed run wrote past it).

`loop` is the `Loop` just run (its first step, per-step losses, logs). New
behaviour (export, a profiler window, an early stop) is a new action: the
Controller's loop does not change.
"""

import dataclasses
import time
from typing import Callable

import numpy as np


@dataclasses.dataclass
class Loop:
  """One train loop's outcome, as the actions see it."""
  first_step: int  # the global step of losses[0]
  losses: np.ndarray  # the global mean loss of each step
  logs: dict[str, float]  # mean loss, train metrics, rate, speed

  @property
  def last_step(self) -> int:
    return self.first_step + len(self.losses) - 1


class Action:
  """Runs `fn(step, loop)` when its trigger says so (see module doc)."""

  def __init__(self, fn: Callable[[int, Loop | None], None], *,
               every_steps: int = 0, every_secs: float = 0.0,
               every_loop: bool = False, at_end: bool = False,
               on_stop: bool = False,
               on_start: Callable[[int], None] | None = None,
               clock: Callable[[], float] = time.monotonic,
               name: str | None = None):
    if every_steps < 0 or every_secs < 0:
      raise ValueError(f"action {name or fn}: every_steps={every_steps} and"
                       f" every_secs={every_secs} must be >= 0")
    self.fn = fn
    self.every_steps = every_steps
    self.every_secs = every_secs
    self.every_loop = every_loop
    self.at_end = at_end
    self.on_stop = on_stop
    self._on_start = on_start
    self.name = name or getattr(fn, "__name__", type(fn).__name__)
    self._clock = clock
    self._last_step = 0
    self._last_time = 0.0

  def start(self, step: int) -> None:
    """Resets the trigger at the step training starts (or resumes) from."""
    self._last_step = step
    self._last_time = self._clock()
    if self._on_start is not None:
      self._on_start(step)

  def boundary(self, step: int) -> int | None:
    """The next step after `step` this action must land on, if step-based."""
    if not self.every_steps:
      return None
    return (step // self.every_steps + 1) * self.every_steps

  def due(self, step: int, *, end: bool = False, stop: bool = False,
          agree: Callable[[bool], bool] = bool) -> bool:
    """Whether the action fires after a loop that ended at `step`.

    `agree`: makes a per-process decision (the clock) the same on every
    worker; it is called whenever `every_secs` is set, so that every worker
    calls it at the same point.
    """
    late = bool(self.every_secs) and agree(
        self._clock() - self._last_time >= self.every_secs)
    if (end and self.at_end) or (stop and self.on_stop) or self.every_loop:
      return True
    if self.every_steps and (step // self.every_steps !=
                             self._last_step // self.every_steps):
      return True
    return late

  def __call__(self, step: int, loop: Loop | None, *, end: bool = False,
               stop: bool = False, agree: Callable[[bool], bool] = bool
               ) -> bool:
    """Fires if due; returns whether it fired."""
    if not self.due(step, end=end, stop=stop, agree=agree):
      self._last_step = step
      return False
    self.fn(step, loop)
    self._last_step = step
    self._last_time = self._clock()
    return True
