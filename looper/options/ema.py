"""A moving average of the weights (`optimizer.ema_decay`), used for eval and export.

Synopsis::

    with strategy.scope():
      average = ema.WeightAverage(model.trainable_variables, decay=0.999)
    average.update()              # in each replica's step, after the update
    with average.swapped():       # the model holds the average inside
      evaluate()
    checkpoint_items["ema"] = average.averages

The averages are float32 variables like the weights, checkpointed so a
resumed run averages on from where it was. Each replica updates its own
copy (aggregation NONE, as Keras' own EMA slots): the weights are the same
on every replica after the update, so the averages stay the same with no
communication. ONLY_FIRST_REPLICA would make every assign a merge call
and a broadcast per variable per step.

Why not Keras' own (`use_ema=True` + `SwapEMAWeights`): its averages are
as exact under tf.distribute, but its swap goes by addition (a+b, a-b)
and does not give the weights back: one swap there and back changed 740
of 1,604 weights of a small Dense model (by up to 3e-8, Keras 3.15), so
every evaluation would move training off its curve. This swap copies.
"""

import contextlib

import tensorflow as tf


def step(averages, values, decay: float) -> None:
  """average <- decay * average + (1 - decay) * value, for each pair: the
  one formula of the replicated average and the sharded one (sharding)."""
  for average, value in zip(averages, values):
    average.assign(decay * average + (1 - decay) * value)


class WeightAverage:
  """average <- decay * average + (1 - decay) * weight, after every update."""

  def __init__(self, variables, decay: float):
    """Call inside `strategy.scope()`; starts from the current weights."""
    self.decay = decay
    self.variables = list(variables)
    self.averages = [tf.Variable(
        v.value, trainable=False, name="ema",
        aggregation=tf.VariableAggregation.NONE)
                     for v in self.variables]

  def checkpointed(self) -> list:
    """What a checkpoint holds: the averages."""
    return self.averages

  def update(self) -> None:
    """One step of the average (in replica context, after the update)."""
    step(self.averages, [v.value for v in self.variables], self.decay)

  @contextlib.contextmanager
  def swapped(self):
    """The variables hold the average inside, their own values after."""
    self._swap()
    try:
      yield
    finally:
      self._swap()

  @tf.function(autograph=False)
  def _swap(self):
    for average, v in zip(self.averages, self.variables):
      trained = tf.identity(v.value)
      v.assign(average)
      average.assign(trained)
