"""What the Controller needs of its collaborators, as Protocols: looper's own and the tests' fakes have it.

Synopsis::

    class FakeTrainer:                     # a test's trainer: a TrainerSurface
      global_step = 0
      ...
    controller.Controller(FakeTrainer(), checkpointer=..., data=...)

The Controller (looper.control.controller) knows nothing of tf.distribute or
Keras: it calls the Trainer to run steps, the Checkpointer to save and
restore, the Input to say and move its position, the spike guard and the
peak; each Protocol below is that call list, and the class named in its
docstring is looper's own.
"""

from typing import Protocol

import numpy as np


class TrainerSurface(Protocol):
  """What the Controller calls on a trainer (`looper.train.trainer.Trainer`)."""
  global_step: int  # updates done (a property on the Trainer)
  weights_finite: bool  # after the last `train` call
  stop: "StopSurface"  # the stop request (`looper.train.stopping.StopFlag`)

  def train(self, steps: int
            ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Runs up to `steps` steps; (each step's values by name: 'loss', the
    global mean loss, first; logs). The logs may hold the work done, which
    the Controller turns into rates over the loop's time: 'flops' (all
    replicas) and, for sequences, 'tokens'."""

  def learning_rate(self) -> float:
    """The current learning rate."""


class StopSurface(Protocol):
  """The trainer's stop request (`looper.train.stopping.StopFlag`)."""
  requested: bool  # a stop took effect (all workers agreed)
  reason: str | None  # why, once requested

  def request(self, reason: str) -> None:
    """Stops the running or next loop after its current step; any thread."""

  def agree(self, flag: bool) -> bool:
    """`flag` or-ed over all workers; every worker calls it alike."""


class DataSurface(Protocol):
  """Where the train data are (`looper.data.input.Input`): the roll-back
  moves them on past what blew up."""
  data_position: int  # global train examples consumed

  def seek(self, position: int) -> None:
    """Reopens the train stream at `position` examples."""


class BatchSurface(Protocol):
  """The run's batch numbers (`looper.data.batch.Batch`)."""
  global_batch_size: int  # examples per update


class CheckpointerSurface(Protocol):
  """What the Controller calls on a `looper.workdir.checkpoint.Checkpointer`."""
  directory: str

  def restore(self, path: str | None = None) -> str | None:
    """Restores `path` (default: the newest); its path, or None."""

  def save(self, step: int, *, sync: bool = False, force: bool = False
           ) -> str | None:
    """Saves the state as step `step`."""

  def latest(self) -> str | None:
    """The newest complete checkpoint."""

  def all(self) -> list[str]:
    """Every complete checkpoint, oldest first."""


class SpikeSurface(Protocol):
  """Loss spikes (`looper.control.spikes.SpikeGuard`)."""

  def spike(self, losses: np.ndarray, first_step: int) -> str | None:
    """Why this loop is a spike (one line), or None."""

  def add(self, losses: np.ndarray) -> None:
    """A kept loop joins the recent losses (restored with a checkpoint)."""


class PeakSurface(Protocol):
  """The peak FLOP/s `mfu` divides by (`looper.measure.peak_flops.Peak`)."""
  flops_per_sec: float  # of all the run's devices

  def beaten(self, seen: float) -> str:
    """A loop ran at `seen` FLOP/s, above the peak: raises it to at least
    that; says what was done (one line's end)."""
