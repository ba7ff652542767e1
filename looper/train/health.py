"""Training health per loop: the gradient's norm, the weights' and the update ratio.

Synopsis (what the Trainer does under `train.health_metrics`)::

    with strategy.scope():
      health = Health(strategy, model.trainable_variables)
    optimizers.after_sum(optimizer, observe=health.observe)  # each update
    health.start()             # in the train function, before its steps
    logs.update(health.end())  # after them: the four figures below

A loop's figures (the train line, TensorBoard, metrics.jsonl), each of the
global batch's update, so the same on any number of replicas or workers:
  grad_norm      the mean over the loop's updates of ||g||: g the gradient
                 summed over replicas and micro-batches (of the global
                 batch's mean loss), before optimizer.clip_global_norm and
                 unscaled under loss scaling (an update loss scaling skips,
                 its gradient not finite, does not count; none: 0)
  grad_norm_max  the largest of them
  weight_norm    ||w|| at the loop's end, w every trainable weight as one
                 vector
  update_ratio   ||w_end - w_start|| / ||w_start||: the loop's net update
                 relative to the weights it started from

What LLM trainers log: MaxText `learning/raw_grad_norm` (before clipping)
and `learning/param_norm` each step; Composer's OptimizerMonitor
`l2_norm/grad/global`, and per layer and step `l2_norm_ratio/update_param`
(||update|| / ||param||, Karpathy's "update to data" ratio, ~1e-3 when
healthy). The ratio here is the loop's, not a step's: a step's needs the
weights before every update (a copy of each weight per step, in the loop
body); over K steps the net ratio is between sqrt(K) (updates in random
directions) and K (aligned) times a step's, so it also shows noise.

No host wait and no collective per step: each update's norm is taken once
where clipping takes it (`optimizers.after_sum`, after the optimizer's own
all-reduce: every replica holds the global gradient), and added into
unsaved per-replica variables in the replica step, as the loss buffer is
(looper.train.loop). `start` and `end` run once per loop on each replica
(`strategy.run`, as the finiteness check): the start copies the weights (one
unsaved copy of the trainable weights per device), the end reads replica
0's sums (every replica holds the same) and takes the norms where the
weights live: three scalars per loop.
"""

import tensorflow as tf

# Each replica's own copy, read as replica 0's (every replica holds the
# same values); not in any checkpoint.
_PER_REPLICA = dict(trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class Health:
  """The loop's health figures (see module doc).

  Args:
    strategy: the run's tf.distribute strategy.
    weights: the trainable weights (Keras variables: a model's).
  """

  def __init__(self, strategy: tf.distribute.Strategy, weights):
    self._strategy, self._weights = strategy, list(weights)
    with strategy.scope():
      # The loop's gradient norms: [their sum, updates], their max.
      self._sum = tf.Variable(tf.zeros([2]), name="grad_norms",
                              **_PER_REPLICA)
      self._max = tf.Variable(0.0, name="grad_norm_max", **_PER_REPLICA)
      self._start = [tf.Variable(tf.zeros(w.shape, w.dtype),
                                 name="loop_start", **_PER_REPLICA)
                     for w in self._weights]

  def observe(self, norm: tf.Tensor) -> None:
    """One update's gradient norm (in the replica step): a whole-variable
    write (a slice of a TPU variable has no assign)."""
    norm = tf.cast(norm, tf.float32)
    self._sum.assign_add(tf.stack([norm, 1.0]))
    self._max.assign(tf.maximum(self._max.read_value(), norm))

  def start(self) -> None:
    """Before the loop's steps (cross-replica context): each replica zeroes
    its sums and copies its weights."""
    def replica():
      self._sum.assign(tf.zeros([2]))
      self._max.assign(0.0)
      for start, weight in zip(self._start, self._weights):
        start.assign(weight.value)
    self._strategy.run(replica)

  def end(self) -> dict[str, tf.Tensor]:
    """After the loop's steps (cross-replica context): the figures."""
    def replica():
      now = [tf.convert_to_tensor(w.value) for w in self._weights]
      start = [s.read_value() for s in self._start]
      return tf.concat([self._sum.read_value(), tf.stack([
          self._max.read_value(), _squares(now),
          _squares([a - b for a, b in zip(now, start)]),
          _squares(start)])], 0)
    first = self._strategy.experimental_local_results(
        self._strategy.run(replica))[0]
    total, updates, most, now, moved, start = tf.unstack(first)
    return {"grad_norm": tf.math.divide_no_nan(total, updates),
            "grad_norm_max": most, "weight_norm": tf.sqrt(now),
            "update_ratio": tf.math.divide_no_nan(tf.sqrt(moved),
                                                  tf.sqrt(start))}


def _squares(tensors) -> tf.Tensor:
  """The sum of the squares of every element of `tensors` (one kernel per
  tensor, no squared copy of it: tf.nn.l2_loss)."""
  return 2.0 * tf.add_n([tf.nn.l2_loss(t) for t in tensors])
