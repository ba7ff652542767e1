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
`clip_by_global_norm_of_sum` is `optimizer.clip_global_norm`; `sum_once`
makes an optimizer skip its all-reduce of gradients the clip summed.
"""

import math
import threading

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


# Per replica thread (MirroredStrategy traces each replica in its own):
# `summed` - the gradients this replica holds are already the sum over
# replicas (clip_by_global_norm_of_sum made them so), until the
# optimizer's all-reduce sees it and skips.
_STATE = threading.local()


def clip_by_global_norm_of_sum(grads, clip_norm: float, unscale=None):
  """The SUM over replicas of `grads`, scaled to a global norm of at most
  `clip_norm` (one all-reduce; an optimizer under `sum_once` then skips
  its own).

  Keras' clipnorm/global_clipnorm clip each replica's gradients before the
  sum, which changes the update with the replica count; this clips the
  gradient of the global batch, the same on any number of replicas. The
  norm needs the summed gradients, so they are summed here once, and the
  update uses them as they are: a second, full-size all-reduce in the
  optimizer would double the step's communication.

  Args:
    grads: this replica's gradients (in replica context).
    clip_norm: the largest global norm of the summed gradients.
    unscale: the loss scale the gradients carry (mixed_float16), or None.
  """
  total = tf.distribute.get_replica_context().all_reduce("SUM", grads)
  norm = tf.linalg.global_norm([tf.cast(g, tf.float32) for g in total])
  if unscale is not None:
    norm /= tf.cast(unscale, tf.float32)
  factor = tf.minimum(1.0, clip_norm / tf.maximum(norm, 1e-12))
  _STATE.summed = True
  return [g * tf.cast(factor, g.dtype) for g in total]


def sum_once(optimizer: keras.optimizers.Optimizer) -> None:
  """Makes `optimizer` skip its all-reduce (SUM) of gradients that
  clip_by_global_norm_of_sum already summed, in the same replica thread;
  any other gradients it sums as before. Call once, after building it.

  Keras' TensorFlow optimizer always all-reduces in replica context, in
  `_all_reduce_sum_gradients`, which has no switch: it is wrapped here (on
  the optimizer that owns the slots, inside a LossScaleOptimizer).
  """
  target = getattr(optimizer, "inner_optimizer", optimizer)
  original = target._all_reduce_sum_gradients  # pylint: disable=protected-access

  def all_reduce_unless_summed(grads_and_vars):
    if getattr(_STATE, "summed", False):
      _STATE.summed = False
      return list(grads_and_vars)
    return original(grads_and_vars)
  target._all_reduce_sum_gradients = all_reduce_unless_summed  # pylint: disable=protected-access
