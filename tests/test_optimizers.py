"""looper.optimizers: the warmup schedule, the linear scaling of the rate,
and the clip of the global batch's gradient inside the optimizer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import optimizers


# --- Warmup: the first update uses peak / warmup_steps, not 0 ---------------


def _rates(schedule, steps):
  return [float(schedule(tf.constant(i, tf.int64))) for i in steps]


@pytest.mark.parametrize("decay,after_warmup", [
    # Keras calls the schedule with iterations = k - 1 for update k. Warmup
    # 4, total 10: updates 1-4 ramp to the peak, updates 5-10 decay over the
    # 6 post-warmup updates, and the rate after update 10 is 0.
    ("constant", [1, 1, 1, 1, 1, 1, 1]),
    ("linear", [1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0]),
    ("cosine", [1, 0.5 * (1 + np.cos(np.pi / 6)), 0.75, 0.5, 0.25,
                0.5 * (1 + np.cos(5 * np.pi / 6)), 0]),
])
def test_warmup_first_update_is_not_zero(decay, after_warmup):
  schedule = optimizers.WarmupSchedule(2.0, 4, decay, 10)
  want = [0.5, 1.0, 1.5, 2.0] + [2.0 * f for f in after_warmup]
  np.testing.assert_allclose(_rates(schedule, range(11)), want, atol=1e-6)
  assert _rates(schedule, [11, 1000]) == [want[-1]] * 2


def test_without_warmup_the_schedule_is_unchanged():
  linear = optimizers.WarmupSchedule(1.0, 0, "linear", 4)
  np.testing.assert_allclose(_rates(linear, range(5)), [1, .75, .5, .25, 0])


def test_first_optimizer_update_uses_the_warmup_rate():
  c = lc.default_config().optimizer
  c.name, c.momentum, c.learning_rate, c.warmup_steps = "sgd", 0.0, 1.0, 4
  opt = optimizers.build(c, total_steps=10, global_batch_size=32)
  w = tf.Variable([0.0])
  opt.apply_gradients([(tf.constant([1.0]), w)])
  assert float(w[0]) == pytest.approx(-0.25)  # rate 1.0 / 4, not 0


def test_linear_scaling_of_the_rate_with_the_batch():
  c = lc.default_config().optimizer
  c.learning_rate, c.reference_batch_size = 0.1, 256
  assert optimizers.peak_rate(c, 1024) == 0.1  # off by default
  c.scale_lr_with_batch = True
  assert optimizers.peak_rate(c, 1024) == pytest.approx(0.4)
  c.name, c.momentum, c.warmup_steps = "sgd", 0.0, 2
  opt = optimizers.build(c, total_steps=10, global_batch_size=1024)
  w = tf.Variable([0.0])
  for _ in range(3):  # warmup: 0.4 / 2, then the scaled peak 0.4 twice
    opt.apply_gradients([(tf.constant([1.0]), w)])
  assert float(w[0]) == pytest.approx(-1.0)


@pytest.mark.parametrize("scaled", [False, True])
def test_the_optimizer_clips_the_unscaled_gradient_after_its_sum(scaled):
  with tf.distribute.get_strategy().scope():
    variables = [tf.Variable([0.0]), tf.Variable(tf.zeros([3, 1]))]
    sgd = keras.optimizers.SGD(1.0)
    opt = keras.optimizers.LossScaleOptimizer(sgd) if scaled else sgd
    opt.build(variables)
  optimizers.clip_after_sum(opt, 1.0)
  scale = float(opt.dynamic_scale.numpy()) if scaled else 1.0
  # An Embedding-like sparse gradient (rows 2 and 2 again: 4 in all) and a
  # dense one: global norm 5, clipped to 1.
  grads = [tf.constant([3.0 * scale]),
           tf.IndexedSlices(tf.constant([[1.0], [3.0]]) * scale,
                            tf.constant([2, 2]), tf.constant([3, 1]))]
  opt.apply_gradients(zip(grads, variables))
  np.testing.assert_allclose(variables[0].numpy(), [-0.6], rtol=1e-6)
  np.testing.assert_allclose(variables[1].numpy()[:, 0], [0, 0, -0.8],
                             rtol=1e-6)
