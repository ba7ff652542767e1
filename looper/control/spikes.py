"""Loss spikes: a loop whose largest step loss is far above recent steps'.

Synopsis (what looper.run.Run builds; the Controller asks it each loop)::

    guard = spikes.SpikeGuard(strategy, factor=10.0)  # train.spike_factor
    items.update(guard.checkpoint_items())   # its recent losses, saved
    why = guard.spike(losses, first_step=31)  # None, or the one line why
    guard.add(losses)                         # a kept loop's steps join

A loop spikes when its largest step loss is above `factor` times the
median loss of the last WINDOW steps before it, once MIN_STEPS are known
(the median of fewer says little while the loss falls fast), and if that
median is above 0 (a loss that may be negative has no scale to multiply).
The Controller rolls a spike back as it does a NaN (train.nan_recovery_tries:
the last checkpoint restored, the data since skipped, one line saying so).
Steps' losses, not loops' means: a stop (SIGTERM) cuts a loop in two, and
the means would then differ from an uninterrupted run's; the last WINDOW
steps do not depend on where loops end.

The recent losses live in checkpointed variables: a resumed run, and a
roll-back, compare with the losses the uninterrupted run had at that step.
Written from the host once per loop (WINDOW floats, a count). With the
factor at 0 (off) no guard is built: the loop and the checkpoint are as
without it (a factor first set on a resumed run looks for spikes again
after MIN_STEPS steps, said once: workdir.checkpoint.ADDED_LATER).
"""

import numpy as np
import tensorflow as tf

WINDOW = 1000  # steps whose losses the median is of
MIN_STEPS = 20  # steps known before a spike is looked for


class SpikeGuard:
  """train.spike_factor's check (see module doc).

  Args:
    strategy: the run's strategy (the variable is made in its scope, as the
      data position is).
    factor: train.spike_factor (> 1).
  """

  def __init__(self, strategy: tf.distribute.Strategy, factor: float):
    self.factor = factor
    kept = dict(trainable=False,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    with strategy.scope():
      # The last `known` entries hold the steps' losses, oldest first.
      self._losses = tf.Variable(np.zeros([WINDOW], np.float32),
                                 name="losses", **kept)
      self._known = tf.Variable(0, dtype=tf.int64, name="known", **kept)

  def checkpoint_items(self) -> dict:
    return {"recent_losses": {"losses": self._losses, "known": self._known}}

  @property
  def recent(self) -> np.ndarray:
    """The recent steps' losses, oldest first."""
    known = int(self._known.numpy())
    return self._losses.numpy()[WINDOW - known:]

  def spike(self, losses: np.ndarray, first_step: int) -> str | None:
    """Why the loop of `losses` (its steps from `first_step`) is a spike,
    one line; None if it is not."""
    known = self.recent
    if len(known) < MIN_STEPS or not len(losses):
      return None
    median = float(np.median(known))
    worst = int(np.argmax(losses))
    if median <= 0 or losses[worst] <= self.factor * median:
      return None
    return (f"train loss spiked to {losses[worst]:.4g} at step"
            f" {first_step + worst}, above train.spike_factor="
            f"{self.factor:g} x {median:.4g} (the median loss of the last"
            f" {len(known)} steps)")

  def add(self, losses: np.ndarray) -> None:
    """A kept loop's step `losses` join the recent ones (the oldest
    leave)."""
    recent = np.append(self._losses.numpy(), np.float32(losses))[-WINDOW:]
    self._losses.assign(recent)
    self._known.assign(min(int(self._known.numpy()) + len(losses), WINDOW))
