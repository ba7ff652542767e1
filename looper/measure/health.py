"""Training health per loop: the weights' norm, the update ratio, the gradient's norm.

Synopsis (what the Trainer does under `train.health_metrics` and
`train.grad_norm`)::

    with strategy.scope():
      health = Health(strategy, model.trainable_variables, gradients=True)
    optimizers.after_sum(optimizer, observe=health.observe)  # each update
    loop = TrainLoop(health.around(step), ...)  # step: values by name
    health.start()             # in the train function, before its steps
    logs.update(health.end(values))   # after them: the figures

A loop's figures (TensorBoard, metrics.jsonl, the trackers), each of the
global batch's update, so the same on any number of replicas or workers.
The weights' (train.health_metrics, on by default: per loop, ~0 cost):
  weight_norm    ||w|| at the loop's end, w every trainable weight as one
                 vector
  update_ratio   ||w_end - w_start|| / ||w_start||: the loop's net update
                 relative to the weights it started from
The gradient's (train.grad_norm, off by default: per update, it reads
every gradient once more, ~1.5% of a small MLP's step on 2 CPU cores,
over the 1% a default may cost; BUILD.md "Benchmarks"):
  grad_norm      the mean over the loop's updates of ||g||: g the gradient
                 summed over replicas and micro-batches (of the global
                 batch's mean loss), before optimizer.clip_global_norm and
                 unscaled under loss scaling (an update loss scaling skips,
                 its gradient not finite, does not count; none: 0)
  grad_norm_max  the largest of them

What LLM trainers log: MaxText `learning/raw_grad_norm` (before clipping)
and `learning/param_norm` each step; Composer's OptimizerMonitor
`l2_norm/grad/global`, and per layer and step `l2_norm_ratio/update_param`
(||update|| / ||param||, Karpathy's "update to data" ratio, ~1e-3 when
healthy). The ratio here is the loop's, not a step's: a step's needs the
weights before every update (a copy of each weight per step, in the loop
body); over K steps the net ratio is between sqrt(K) (updates in random
directions) and K (aligned) times a step's, so it also shows noise.

No host wait and no collective per step, and no state of its own per
step: each update's squared norm is taken where clipping takes it
(`optimizers.after_sum`, after the optimizer's own all-reduce: every
replica holds the global gradient), each replica squaring about 1/N of
it (`optimizers.share_of_squares`), and goes out of the step as one more
per-step value (SQUARES) beside the loss, in the loop's one buffer
(looper.train.loop): summed over the replicas when the loop reads it, as
the loss is. A step that made no update (loss scaling skipped it, or the
step never called the optimizer) gives -1 per replica: not counted.
`start` and `end` run once per loop (`strategy.run`, as the finiteness
check), on each worker's first replica (every replica holds the same
weights): the start copies the weights (one unsaved copy of the
trainable weights); the end takes the mean and max of the steps' norms
and the weights' norms where the weights live.

An update made inside a branch of the step (loss scaling's: Keras applies
only finite gradients, in a tf.cond) cannot hand its tensor out of it: its
square passes through a per-replica scalar variable, read and reset by the
step (two scalar ops a step, under loss scaling only).

Cost (tests/bench/health.py; BUILD.md "Benchmarks"): per update an
L2Loss kernel per gradient a replica squares (about 1/N of them), an AddN
and a Mul: the MLP of 669k weights ~45 us a step, 0.3-1.5% of its step
(1 or 2 replicas); per loop a copy and three norms of the weights.
"""

import threading

import tensorflow as tf

# The per-step value the health figures add to a step's (its name in the
# loop's buffer; the Trainer takes it out before the writers see them).
SQUARES = "grad_norm_squared"
# Each replica's own copy, read as replica 0's (every replica holds the
# same values); not in any checkpoint.
_PER_REPLICA = dict(trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
_NONE = -1.0  # a step's square when it made no update


class Health:
  """The loop's health figures (see module doc).

  Args:
    strategy: the run's tf.distribute strategy.
    weights: the trainable weights (Keras variables: a model's).
    gradients: the gradient's figures too (each update's norm).
    weight_figures: the weights' figures (their norm, the update ratio).
  """

  def __init__(self, strategy: tf.distribute.Strategy, weights, *,
               gradients: bool, weight_figures: bool = True):
    self._strategy, self._weights = strategy, list(weights)
    self.gradients, self._weight_figures = gradients, weight_figures
    with strategy.scope():
      self._start = [tf.Variable(tf.zeros(w.shape, w.dtype),
                                 name="loop_start", **_PER_REPLICA)
                     for w in self._weights] if weight_figures else []
      self._kept = tf.Variable(_NONE, name="grad_square", **_PER_REPLICA)
    # Per replica thread (MirroredStrategy traces each replica in a thread
    # of its own): the graph of the step being traced and its update's
    # square, while it is traced.
    self._traced = threading.local()
    self._in_branch = False  # an update was seen inside a branch

  def around(self, step_fn):
    """`step_fn` (a step returning its values by name) with the update's
    share of ||g||^2 beside its values, as SQUARES (`step_fn` itself
    without the gradient's figures)."""
    if not self.gradients:
      return step_fn
    def step(batch):
      traced = self._traced
      traced.graph, traced.square = tf.compat.v1.get_default_graph(), None
      values = step_fn(batch)
      if SQUARES in values:
        raise ValueError(f"The train step returned {SQUARES!r}, the name"
                         " of the health figures' own value; rename it")
      return {**values, SQUARES: self._square(traced)}
    return step

  def observe(self, share: tf.Tensor) -> None:
    """One update's `share` of ||g||^2 (`optimizers.after_sum`'s hook, in
    the replica step): kept as it is, or, made inside a branch of the
    step, through the variable (module doc). A step that updates twice
    reports its last update."""
    share = tf.cast(share, tf.float32)
    if tf.compat.v1.get_default_graph() is getattr(self._traced, "graph",
                                                   None):
      self._traced.square = share
    else:
      self._kept.assign(share)
      self._in_branch = True

  def _square(self, traced) -> tf.Tensor:
    if traced.square is not None:
      return traced.square
    if not self._in_branch:
      return tf.constant(_NONE)
    square = self._kept.read_value()
    self._kept.assign(_NONE)  # after the read: the next step's own
    return square

  def start(self) -> None:
    """Before the loop's steps (cross-replica context): this worker's
    first replica copies its weights (every replica holds the same)."""
    if not self._weight_figures:
      return
    def replica():
      if _first(self._strategy):
        for start, weight in zip(self._start, self._weights):
          start.assign(weight.value)
    self._strategy.run(replica)

  def end(self, values: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """After the loop's steps (cross-replica context), given the steps'
    `values` (SQUARES among them with the gradient's figures; summed over
    the replicas): the figures."""
    figures = {}
    if self.gradients:
      squares = values[SQUARES]
      made = squares >= 0.0  # the steps that made an update
      norms = tf.where(made, tf.sqrt(tf.maximum(squares, 0.0)), 0.0)
      figures["grad_norm"] = tf.math.divide_no_nan(
          tf.reduce_sum(norms), tf.reduce_sum(tf.cast(made, tf.float32)))
      # 0 with no update (the max of none is -inf)
      figures["grad_norm_max"] = tf.maximum(tf.reduce_max(norms), 0.0)
    if self._weight_figures:
      figures.update(self._weight_norms())
    return figures

  def _weight_norms(self) -> dict[str, tf.Tensor]:
    """The weights' norm now and the loop's update ratio, from this
    worker's first replica."""
    def replica():
      if not _first(self._strategy):
        return tf.zeros([3])
      now = [tf.convert_to_tensor(w.value) for w in self._weights]
      start = [s.read_value() for s in self._start]
      return tf.stack([_squares(now),
                       _squares([a - b for a, b in zip(now, start)]),
                       _squares(start)])
    now, moved, start = tf.unstack(self._strategy.experimental_local_results(
        self._strategy.run(replica))[0])
    return {"weight_norm": tf.sqrt(now),
            "update_ratio": tf.math.divide_no_nan(tf.sqrt(moved),
                                                  tf.sqrt(start))}


def _first(strategy: tf.distribute.Strategy) -> bool:
  """Whether this replica does the per-loop work: this worker's first (its
  result is the one read), or every one where the id is known only at run
  time (a TPU's: the first's result is read all the same)."""
  replica = tf.get_static_value(
      tf.distribute.get_replica_context().replica_id_in_sync_group)
  return replica is None or replica == 0 or replica % len(
      strategy.extended.worker_devices) == 0


def _squares(tensors) -> tf.Tensor:
  """The sum of the squares of every element of `tensors` (one kernel per
  tensor, no squared copy of it: tf.nn.l2_loss)."""
  return 2.0 * tf.add_n([tf.nn.l2_loss(t) for t in tensors])
