"""Training health per loop: the gradient's norm, the weights' and the update ratio.

Synopsis (what the Trainer does under `train.health_metrics`)::

    with strategy.scope():
      health = Health(strategy, model.trainable_variables, steps_per_loop)
    optimizers.after_sum(optimizer, observe=health.observe)  # each update
    health.room(steps)         # before a longer call than steps_per_loop
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

No host wait and no collective per step: each update's squared norm is
taken where clipping takes it (`optimizers.after_sum`, after the
optimizer's own all-reduce: every replica holds the global gradient),
each replica squaring its 1/N of it (`optimizers.share_of_squares`), and
written to slot k (the loop's k-th update) of an unsaved per-replica
buffer, as the losses are (looper.train.loop). `start` and `end` run once
per loop (`strategy.run`, as the finiteness check): the start copies the
weights (one unsaved copy of the trainable weights per device) and zeroes
the update count; the end sums the buffer over the replicas (as the
losses: each update's ||g||^2), takes the mean and max of the square roots
and the weights' norms where the weights live.

Cost (tests/bench/health.py): per update one kernel per gradient over 1/N
of its elements and ~5 scalar ops; N replicas squaring the whole gradient
each cost the MLP 5-8% of its step on 2 logical CPUs sharing 2 cores (2%
split).
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
    updates: the most updates a loop makes (train.steps_per_loop: one
      per step); `room` grows it.
  """

  def __init__(self, strategy: tf.distribute.Strategy, weights,
               updates: int):
    self._strategy, self._weights = strategy, list(weights)
    with strategy.scope():
      self._updates = tf.Variable(0, name="updates", **_PER_REPLICA)
      self._start = [tf.Variable(tf.zeros(w.shape, w.dtype),
                                 name="loop_start", **_PER_REPLICA)
                     for w in self._weights]
    self._squares = None
    self.room(updates)

  def room(self, updates: int) -> None:
    """Room for a loop of `updates` (outside the train function): the
    buffer grows at the rule and bound of the loop's loss buffer, whose
    growth traces the train function anew, so no trace holds the old."""
    if self._squares is not None and updates <= self._squares.shape[0]:
      return
    with self._strategy.scope():
      # Update k's ||g||^2: each replica's share at [k], summed on read.
      self._squares = tf.Variable(
          tf.zeros([updates]), trainable=False, name="grad_squares",
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)

  def observe(self, share: tf.Tensor) -> None:
    """One update's `share` of ||g||^2 (in the replica step): the whole
    buffer written back (a slot of a TPU variable has no assign)."""
    k = self._updates.read_value()
    self._squares.assign(tf.tensor_scatter_nd_update(
        self._squares, [[k]], [tf.cast(share, tf.float32)]))
    self._updates.assign_add(1)

  def start(self) -> None:
    """Before the loop's steps (cross-replica context): each replica zeroes
    its count and copies its weights."""
    def replica():
      self._updates.assign(0)
      for start, weight in zip(self._start, self._weights):
        start.assign(weight.value)
    self._strategy.run(replica)

  def end(self) -> dict[str, tf.Tensor]:
    """After the loop's steps (cross-replica context): the figures."""
    def replica():
      now = [tf.convert_to_tensor(w.value) for w in self._weights]
      start = [s.read_value() for s in self._start]
      return tf.stack([_squares(now),
                       _squares([a - b for a, b in zip(now, start)]),
                       _squares(start)])
    now, moved, start = tf.unstack(self._strategy.experimental_local_results(
        self._strategy.run(replica))[0])
    # Replica 0's count (every replica counts the same updates); the
    # squares summed over the replicas: one reduction per loop.
    updates = self._updates.read_value()
    norms = tf.sqrt(self._squares.read_value()[:updates])
    return {"grad_norm": tf.math.divide_no_nan(
                tf.reduce_sum(norms), tf.cast(updates, tf.float32)),
            # 0 with no update (the max of none is -inf)
            "grad_norm_max": tf.maximum(tf.reduce_max(norms), 0.0),
            "weight_norm": tf.sqrt(now),
            "update_ratio": tf.math.divide_no_nan(tf.sqrt(moved),
                                                  tf.sqrt(start))}


def _squares(tensors) -> tf.Tensor:
  """The sum of the squares of every element of `tensors` (one kernel per
  tensor, no squared copy of it: tf.nn.l2_loss)."""
  return 2.0 * tf.add_n([tf.nn.l2_loss(t) for t in tensors])
