"""The optimizer, learning-rate schedule and gradient clipping of `config.optimizer`.

Synopsis::

    with strategy.scope():
      opt = optimizers.build(config.optimizer, total_steps=config.train.steps,
                             global_batch_size=config.train.batch_size)
      opt.build(model.trainable_variables)   # before the first trace

Schedules are functions of the optimizer's step: `constant`, `cosine` (to 0
at `total_steps`) and `linear` (to 0 at `total_steps`), each optionally after
`warmup_steps` of linear warmup (update k of the warmup uses k/warmup_steps
of the rate; see `WarmupSchedule`). With `scale_lr_with_batch` the peak
rate is `learning_rate * batch / reference_batch_size` (the linear scaling
rule of large-batch and TPU training, meant with warmup).

The names `optimizer.name` and `optimizer.schedule` accept are the keys of
OPTIMIZERS and SCHEDULES (`config.validate` reads them).
`clip_after_sum` is `optimizer.clip_global_norm`: the optimizer clips the
global batch's gradient after its all-reduce. `add` sums two gradients of
a variable, sparse (an Embedding's) or dense.
"""

import math

import keras
import ml_collections
import tensorflow as tf

# `optimizer.name` -> fn(learning rate or schedule, config.optimizer).
OPTIMIZERS = {
    "sgd": lambda lr, opt: keras.optimizers.SGD(lr, momentum=opt.momentum),
    "adam": lambda lr, opt: keras.optimizers.Adam(lr),
    "adamw": lambda lr, opt: keras.optimizers.AdamW(
        lr, weight_decay=opt.weight_decay),
}

# `optimizer.schedule` -> the factor of the peak rate after the warmup, as
# a function of the fraction d in [0, 1] of the post-warmup updates done.
SCHEDULES = {
    "constant": lambda d: tf.ones_like(d),
    "linear": lambda d: 1.0 - d,  # to 0 at train.steps
    "cosine": lambda d: 0.5 * (1.0 + tf.cos(d * math.pi)),  # to 0 too
}


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Linear warmup to `peak` over `warmup_steps` updates, then `decay`.

  Keras calls the schedule with the updates done so far, `i = k - 1` for
  update k (1-based). With W = warmup_steps and T = total_steps, update k
  uses::

    peak * min(1, k / W) * decay((k - 1 - W) / (T - W), clipped to [0, 1])

  where decay(d) is SCHEDULES[decay](d): 1 (constant), 1 - d (linear) or
  (1 + cos(pi d)) / 2 (cosine). So the first update uses peak / W (not 0: warmup counts the
  update being made), update W is the first at the peak, and the decay
  starts from the peak at update W + 1 (so updates W and W + 1 both use the
  peak) and reaches 0 after T updates: update T uses peak / (T - W) under
  `linear`, and the rate the optimizer reports at step T is 0. Without
  warmup, update 1 uses the peak.
  """

  def __init__(self, peak: float, warmup_steps: int, decay: str,
               total_steps: int):
    self.peak = peak
    self.warmup_steps = warmup_steps
    self.decay = decay
    self.total_steps = total_steps

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    warmup = float(self.warmup_steps)
    # Fraction of the post-warmup span done, in [0, 1].
    span = max(float(self.total_steps) - warmup, 1.0)
    done = tf.clip_by_value((step - warmup) / span, 0.0, 1.0)
    factor = SCHEDULES[self.decay](done)
    if self.warmup_steps:
      # `step` updates are done; this one is number step + 1. Counting from
      # `step` would make the first update a no-op with rate 0.
      factor *= tf.minimum(1.0, (step + 1.0) / warmup)
    return self.peak * factor

  def get_config(self):
    return dict(peak=self.peak, warmup_steps=self.warmup_steps,
                decay=self.decay, total_steps=self.total_steps)


def peak_rate(opt: ml_collections.ConfigDict, global_batch_size: int) -> float:
  """The configured rate, scaled linearly with the batch if asked to."""
  if not opt.scale_lr_with_batch:
    return opt.learning_rate
  return opt.learning_rate * global_batch_size / opt.reference_batch_size


def build(opt: ml_collections.ConfigDict, total_steps: int,
          global_batch_size: int) -> keras.optimizers.Optimizer:
  """Returns the Keras optimizer for `config.optimizer` (call inside scope)."""
  # Always a schedule, even for a constant rate: Keras checkpoints a plain
  # float rate as a variable, so a resumed run would silently keep the old
  # rate over a new --config.optimizer.learning_rate. A schedule is a
  # function of the restored step and the config alone.
  lr = WarmupSchedule(peak_rate(opt, global_batch_size), opt.warmup_steps,
                      opt.schedule, total_steps)
  return OPTIMIZERS[opt.name](lr, opt)


def clip_after_sum(optimizer: keras.optimizers.Optimizer,
                   clip_norm: float) -> None:
  """Makes `optimizer` clip the SUM over replicas of the gradients to a
  global norm of at most `clip_norm` (`optimizer.clip_global_norm`), right
  after its own all-reduce. Call once, after building it.

  Keras' clipnorm/global_clipnorm clip each replica's gradients before the
  sum, which changes the update with the replica count; this clips the
  gradient of the global batch, the same on any number of replicas, and
  costs no all-reduce of its own (the norm needs the sum: summing in the
  step and again in the optimizer doubled the step's communication).

  The clip runs wherever the optimizer sums, whichever thread that is:
  Keras' LossScaleOptimizer applies its inner optimizer through
  `call_for_each_replica` (new threads under MirroredStrategy), with the
  gradients already unscaled and known finite. Keras' TensorFlow optimizer
  sums in `_all_reduce_sum_gradients`, which has no public hook: it is
  wrapped here, on the optimizer that owns the slots.
  """
  target = getattr(optimizer, "inner_optimizer", optimizer)
  all_reduce = target._all_reduce_sum_gradients  # pylint: disable=protected-access

  def all_reduce_then_clip(grads_and_vars):
    grads, variables = zip(*all_reduce(grads_and_vars))
    norm = tf.sqrt(tf.add_n([_squared_norm(g) for g in grads
                             if g is not None]))
    factor = clip_norm / tf.maximum(norm, clip_norm)
    return [(_times(g, factor), v) for g, v in zip(grads, variables)]
  target._all_reduce_sum_gradients = all_reduce_then_clip  # pylint: disable=protected-access


def _squared_norm(grad) -> tf.Tensor:
  """|grad|^2 in float32. An Embedding's gradient (IndexedSlices) may hold
  a row several times (a token seen twice; the replicas' rows after the
  sum, which gathers them): the rows add up first, as they do in the
  update (TensorFlow's clip_by_global_norm squares them apart, so its norm
  would change with the replica count)."""
  if isinstance(grad, tf.IndexedSlices):
    rows, where = tf.unique(grad.indices)
    grad = tf.math.unsorted_segment_sum(grad.values, where, tf.size(rows))
  return tf.reduce_sum(tf.square(tf.cast(grad, tf.float32)))


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
  wherever they are applied, as `_squared_norm` adds them), still sparse."""
  if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
    return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                            tf.concat([a.indices, b.indices], 0),
                            a.dense_shape)
  return a + b
