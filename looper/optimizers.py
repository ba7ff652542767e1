"""The optimizer and learning-rate schedule that `config.optimizer` describes.

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
"""

import keras
import ml_collections
import tensorflow as tf


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Linear warmup to `peak` over `warmup_steps` updates, then `decay`.

  Keras calls the schedule with the updates done so far, `i = k - 1` for
  update k (1-based). With W = warmup_steps and T = total_steps, update k
  uses::

    peak * min(1, k / W) * decay((k - 1 - W) / (T - W), clipped to [0, 1])

  where decay(d) is 1 (constant), 1 - d (linear) or (1 + cos(pi d)) / 2
  (cosine). So the first update uses peak / W (not 0: warmup counts the
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
    if self.decay == "cosine":
      factor = 0.5 * (1.0 + tf.cos(done * 3.141592653589793))
    elif self.decay == "linear":
      factor = 1.0 - done
    else:
      factor = tf.constant(1.0)
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
  if opt.name == "sgd":
    return keras.optimizers.SGD(lr, momentum=opt.momentum)
  if opt.name == "adamw":
    return keras.optimizers.AdamW(lr, weight_decay=opt.weight_decay)
  return keras.optimizers.Adam(lr)
