"""The optimizer, learning-rate schedule and gradient clipping of `config.optimizer`.

Synopsis::

    with strategy.scope():
      opt = optimizers.build(config.optimizer, total_steps=config.train.steps,
                             global_batch_size=batch.global_batch_size)
      opt.build(model.trainable_variables)   # before the first trace

Schedules are Keras' (keras.optimizers.schedules), functions of the
optimizer's step: `constant`, `cosine` (to 0 at `total_steps`) and `linear`
(to 0 at `total_steps`), each optionally after `warmup_steps` of linear
warmup (update k of the warmup uses k/warmup_steps of the rate; see
`Warmup`, the one piece Keras cannot express); with config.callbacks,
times the Trainer's `learning_rate_scale` (`Scaled`: how a Keras callback
sets the rate, looper.control.callbacks). With `scale_lr_with_batch`
the peak rate is `learning_rate * batch / reference_batch_size` (the linear
scaling rule of large-batch and TPU training, meant with warmup).

The `optimizer` block is declared here (`config()`: each field, its
default and doc) and checked here (`check`: the names `optimizer.name`
and `optimizer.schedule` accept are the keys of OPTIMIZERS and SCHEDULES);
looper.config composes it.
`after_sum` takes the global batch's gradient norm after the optimizer's
all-reduce: `optimizer.clip_global_norm` clips by it, the health figures
log it. `add` sums two gradients of a variable, sparse (an Embedding's) or
dense.
"""

from typing import Callable

import keras
from keras.optimizers import schedules
import ml_collections
import tensorflow as tf

from looper import compat
from looper import fields

# `optimizer.name` -> fn(learning rate or schedule, config.optimizer).
OPTIMIZERS = {
    "sgd": lambda lr, opt: keras.optimizers.SGD(lr, momentum=opt.momentum),
    "adam": lambda lr, opt: keras.optimizers.Adam(lr),
    "adamw": lambda lr, opt: keras.optimizers.AdamW(
        lr, weight_decay=opt.weight_decay),
}

# `optimizer.schedule` -> Keras' schedule from `peak` over `steps` updates.
SCHEDULES = {
    # Keras has no constant schedule (PiecewiseConstantDecay needs a
    # boundary); a polynomial decay from the peak to the peak is one,
    # exactly: (peak - peak) * (1 - p) + peak.
    "constant": lambda peak, steps: schedules.PolynomialDecay(
        peak, 1, end_learning_rate=peak),
    "linear": lambda peak, steps: schedules.PolynomialDecay(
        peak, steps, end_learning_rate=0.0),  # to 0 at train.steps
    "cosine": lambda peak, steps: schedules.CosineDecay(peak, steps),  # to 0
}


def config() -> ml_collections.ConfigDict:
  """The `optimizer` block: each field's default (its doc above it)."""
  c = ml_collections.ConfigDict()
  c.name = "adam"  # sgd | adam | adamw
  c.learning_rate = 1e-3
  c.schedule = "constant"  # constant | cosine | linear (to 0)
  # Linear warmup before the schedule: update k uses k/warmup_steps of it.
  c.warmup_steps = fields.whole(0, low=0)
  c.momentum = 0.9  # sgd only
  c.weight_decay = 0.0  # adamw only
  # Clip the global-batch gradient to this global norm (0: off); applied
  # after the replicas' sum, unlike Keras' clipnorm.
  c.clip_global_norm = fields.Field(0.0, float, "a norm")
  # Keep an exponential moving average of the weights with this decay
  # (e.g. 0.999; 0: off); eval and export use it. Checkpointed.
  c.ema_decay = 0.0
  # Linear scaling (Goyal et al.): the rate used is learning_rate *
  # train.batch_size / reference_batch_size; pair it with warmup_steps.
  c.scale_lr_with_batch = fields.boolean(False)
  c.reference_batch_size = fields.whole(256)
  return c


def check(opt: ml_collections.ConfigDict) -> None:
  """The `optimizer` block's own rules (warmup_steps against train.steps
  spans blocks: looper.config.check_steps); ConfigError on the first."""
  fields.check_declared(opt, "optimizer")
  fields.check(opt.learning_rate > 0, "optimizer.learning_rate",
               opt.learning_rate, "must be > 0")
  fields.check_choice(opt.name, "optimizer.name", OPTIMIZERS)
  fields.check(isinstance(opt.ema_decay, (int, float)) and
               0 <= opt.ema_decay < 1, "optimizer.ema_decay", opt.ema_decay,
               "must be in [0, 1), e.g. 0.999 (0: off)")
  fields.check_choice(opt.schedule, "optimizer.schedule", SCHEDULES)


def schedule(peak: float, warmup_steps: int, decay: str,
             total_steps: int) -> schedules.LearningRateSchedule:
  """SCHEDULES[decay] from `peak` to its end at `total_steps`, after
  `warmup_steps` of linear warmup (without: Keras' schedule itself)."""
  if not warmup_steps:
    return SCHEDULES[decay](peak, total_steps)
  return Warmup(peak, warmup_steps, decay, total_steps)


class Warmup(schedules.LearningRateSchedule):
  """Linear warmup to `peak` over `warmup_steps` updates, then Keras'
  schedule SCHEDULES[decay] from the peak over the remaining updates.

  Keras calls the schedule with the updates done so far, `i = k - 1` for
  update k (1-based). With W = warmup_steps and T = total_steps, update k
  uses `peak * k / W` for k <= W, then SCHEDULES[decay] at i - W of T - W
  updates. So the first update uses peak / W (not 0: warmup counts the
  update being made), update W is the first at the peak, and the decay
  starts from the peak at update W + 1 (so updates W and W + 1 both use
  the peak) and reaches 0 after T updates: update T uses peak / (T - W)
  under `linear`, and the rate the optimizer reports at step T is 0.

  Why not Keras' own warmup (CosineDecay's warmup_target and warmup_steps;
  PolynomialDecay has none), measured on Keras 3.15.1 with peak 2, W=4,
  T=10: it gives update k (k - 1)/W of the target, so from
  initial_learning_rate=0 the first update has rate 0 (a step that does
  nothing): [0, .5, 1, 1.5, 2, 1.87, ...] for looper's [.5, 1, 1.5, 2, 2,
  1.87, ...]. Starting at peak / W with W - 1 warmup steps matches the ramp
  but starts the decay one update early (0.28 off, 14% of the peak).
  """

  def __init__(self, peak: float, warmup_steps: int, decay: str,
               total_steps: int):
    self.peak = peak
    self.warmup_steps = warmup_steps
    self.decay = decay
    self.total_steps = total_steps
    self._after = SCHEDULES[decay](peak, max(total_steps - warmup_steps, 1))

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    warmup = float(self.warmup_steps)
    # `step` updates are done; this one is number step + 1. The minimum
    # (a no-op here) keeps Grappler from folding peak / W into one constant
    # in the train step's graph, which rounds unlike eager in the last bit.
    ramp = self.peak * tf.minimum(1.0, (step + 1.0) / warmup)
    return tf.where(step < warmup, ramp,
                    self._after(tf.maximum(step - warmup, 0.0)))

  def get_config(self):
    return dict(peak=self.peak, warmup_steps=self.warmup_steps,
                decay=self.decay, total_steps=self.total_steps)


class Scaled(schedules.LearningRateSchedule):
  """`schedule` times `scale`, a float32 variable: how a Keras callback
  (ReduceLROnPlateau, LearningRateScheduler) sets the rate of a run whose
  rate is a schedule, which Keras' optimizer does not let it set. At
  scale 1 every rate is the schedule's, bit for bit."""

  def __init__(self, schedule: schedules.LearningRateSchedule,
               scale: tf.Variable):
    self.schedule, self.scale = schedule, scale

  def __call__(self, step):
    return self.schedule(step) * self.scale

  def get_config(self):
    return {"schedule": schedules.serialize(self.schedule)}


def peak_rate(opt: ml_collections.ConfigDict, global_batch_size: int) -> float:
  """The configured rate, scaled linearly with the batch if asked to."""
  if not opt.scale_lr_with_batch:
    return opt.learning_rate
  return opt.learning_rate * global_batch_size / opt.reference_batch_size


def build(opt: ml_collections.ConfigDict, total_steps: int,
          global_batch_size: int, scale: tf.Variable | None = None
          ) -> keras.optimizers.Optimizer:
  """Returns the Keras optimizer for `config.optimizer` (call inside scope),
  its rate times `scale` if given (`Scaled`)."""
  # Always a schedule, even for a constant rate: Keras checkpoints a plain
  # float rate as a variable, so a resumed run would silently keep the old
  # rate over a new --config.optimizer.learning_rate. A schedule is a
  # function of the restored step and the config alone.
  lr = schedule(peak_rate(opt, global_batch_size), opt.warmup_steps,
                opt.schedule, total_steps)
  return OPTIMIZERS[opt.name](lr if scale is None else Scaled(lr, scale), opt)


# A gradient this large (elements) is squared in parts, a part a replica;
# smaller ones whole, each by one replica: on 2 logical CPUs sharing 2
# cores, per-op costs (~2 us) outweigh the squares of a part. Measured:
# the MLP's 669k gradients (the largest 401k) on Mirrored(2), 90 us a
# step all cut in halves, 45 us whole (tests/bench/health.py).
CUT = 1 << 20


def after_sum(optimizer: keras.optimizers.Optimizer, *,
              clip_norm: float = 0.0,
              observe: Callable[[tf.Tensor], None] | None = None) -> None:
  """Makes `optimizer` take the global norm of the SUM over replicas of the
  gradients (the global batch's gradient) once per update, right after its
  own all-reduce: `observe(share)` gets this replica's share of its square
  (the shares sum to ||g||^2 over the replicas: train.health_metrics,
  looper.measure.health), then a `clip_norm` > 0 clips the sum to at most
  that norm (`optimizer.clip_global_norm`). Call once, after building it;
  neither set: nothing to do.

  Keras' clipnorm/global_clipnorm clip each replica's gradients before the
  sum, which changes the update with the replica count; this clips the
  gradient of the global batch, the same on any number of replicas, and
  costs no all-reduce of its own (the norm needs the sum: summing in the
  step and again in the optimizer doubled the step's communication).
  Observed only, each replica squares about 1/N of the gradient
  (`share_of_squares`); clipped, each needs the whole norm, so each squares
  all of it and replica 0's counts. Keras has no public hook after its
  sum: `compat.after_all_reduce` says where it runs (under a
  LossScaleOptimizer: the gradients unscaled and known finite).
  """
  if not clip_norm and observe is None:
    return

  def transform(grads_and_vars):
    grads, variables = zip(*grads_and_vars)
    present = [g for g in grads if g is not None]
    if not clip_norm:
      observe(share_of_squares(present))
      return grads_and_vars
    squares = _squares(present)
    if observe is not None:
      observe(_once(squares))
    factor = clip_norm / tf.maximum(tf.sqrt(squares), clip_norm)
    return [(_times(g, factor), v) for g, v in zip(grads, variables)]
  compat.after_all_reduce(optimizer, transform)


def share_of_squares(grads) -> tf.Tensor:
  """This replica's share of the sum of the squares of `grads` (the same
  on every replica, as after an all-reduce), in float32: the shares of the
  N replicas sum to it. A gradient of CUT elements or more is cut in N
  contiguous parts, one a replica (each 16-element aligned: a view, no
  copy); the others go whole to one replica each, the largest first to
  the least loaded (the same choice on every replica: static shapes);
  sparse ones (their rows known at run time) count as empty there. A
  replica id known only at run time (a TPU's): every replica squares all,
  replica 0's counts."""
  context = tf.distribute.get_replica_context()
  n = context.num_replicas_in_sync if context else 1
  if n == 1:
    return _squares(grads)
  r = tf.get_static_value(context.replica_id_in_sync_group)
  if r is None:
    return _once(_squares(grads))
  mine, whole, loads = [], [], [0] * n
  for g in grads:
    size = (0 if isinstance(g, tf.IndexedSlices) else
            g.shape.num_elements() or 0)
    if size < CUT:
      whole.append((size, g))
      continue
    part = -(-size // (16 * n)) * 16  # ceil(size / n), 16-aligned
    low, high = min(r * part, size), min((r + 1) * part, size)
    if high > low:
      mine.append(tf.reshape(g, [-1])[low:high])
  for size, g in sorted(whole, key=lambda w: -w[0]):  # stable: all alike
    least = loads.index(min(loads))
    loads[least] += size
    if least == r:
      mine.append(g)
  return _squares(mine)


def _squares(grads) -> tf.Tensor:
  """The sum of the squares of every element of `grads` in float32 (0 for
  none). An Embedding's gradient (IndexedSlices) may hold a row several
  times (a token seen twice; the replicas' rows after the sum, which
  gathers them): the rows add up first, as they do in the update
  (TensorFlow's clip_by_global_norm squares them apart, so its norm would
  change with the replica count). One kernel per gradient, with no squared
  copy of it (tf.nn.l2_loss, as tf.linalg.global_norm): the health figures
  take it every update."""
  halves = []
  for grad in grads:
    if isinstance(grad, tf.IndexedSlices):
      rows, where = tf.unique(grad.indices)
      grad = tf.math.unsorted_segment_sum(grad.values, where, tf.size(rows))
    halves.append(tf.nn.l2_loss(tf.cast(grad, tf.float32)))
  return 2.0 * tf.add_n(halves) if halves else tf.constant(0.0)


def _once(squares: tf.Tensor) -> tf.Tensor:
  """`squares` each replica holds alike, as shares: replica 0's counts."""
  context = tf.distribute.get_replica_context()
  if not context or context.num_replicas_in_sync == 1:
    return squares
  return squares * tf.cast(tf.equal(context.replica_id_in_sync_group, 0),
                           squares.dtype)


def _times(grad, factor):
  if grad is None:
    return None
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(grad.values * tf.cast(factor, grad.dtype),
                            grad.indices, grad.dense_shape)
  return grad * tf.cast(factor, grad.dtype)


def add(a, b):
  """The sum of two gradients of one variable (accumulation). An
  Embedding's are IndexedSlices (rows of the batch's tokens), which `+`
  cannot add: their sum is both sets of rows (repeated rows add up
  wherever they are applied, as `_squares` adds them), still sparse."""
  if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
    return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                            tf.concat([a.indices, b.indices], 0),
                            a.dense_shape)
  return a + b
