"""looper.options.optimizers: the schedules (Keras' own after looper's warmup)
against their documented formula, the linear scaling of the rate, and the
clip of the global batch's gradient inside the optimizer."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper.options import optimizers


# --- The schedules: Keras' own, after looper's warmup -----------------------


def _reference(decay, peak, warmup, total, i):
  """The rate of update k = i + 1 (Keras passes i, the updates done), as
  config.optimizer documents it: k/warmup of the peak during the warmup,
  then the decay over the remaining updates, to 0 after `total`."""
  k = i + 1
  if k <= warmup:
    return peak * k / warmup
  d = min(max(i - warmup, 0) / max(total - warmup, 1), 1.0)
  return peak * {"constant": 1.0, "linear": 1.0 - d,
                 "cosine": (1.0 + math.cos(math.pi * d)) / 2}[decay]


@pytest.mark.parametrize("decay", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup,total", [(0, 10), (4, 10), (100, 1000)])
def test_the_rate_at_each_phase_is_the_documented_formula(decay, warmup,
                                                          total):
  peak = 2.0
  schedule = optimizers.schedule(peak, warmup, decay, total)
  # 0 and 1, the warmup's last and the peak's two, mid-decay, the last
  # update, the rate reported after it (0 but for constant), and beyond.
  steps = sorted({0, 1, max(warmup - 1, 0), warmup, warmup + 1,
                  (warmup + total) // 2, total - 1, total, total + 5})
  want = [_reference(decay, peak, warmup, total, i) for i in steps]
  eager = [float(schedule(tf.constant(i, tf.int64))) for i in steps]
  graph = tf.function(lambda i: schedule(i))  # as the optimizer calls it
  traced = [float(graph(tf.constant(i, tf.int64))) for i in steps]
  for got in (eager, traced):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * peak)
  assert eager[0] == pytest.approx(peak / warmup if warmup else peak)


def test_without_warmup_the_schedule_is_keras_own():
  kinds = {name: type(optimizers.schedule(1.0, 0, name, 10))
           for name in optimizers.SCHEDULES}
  assert kinds == {"constant": keras.optimizers.schedules.PolynomialDecay,
                   "linear": keras.optimizers.schedules.PolynomialDecay,
                   "cosine": keras.optimizers.schedules.CosineDecay}
  warmup = optimizers.schedule(1.0, 4, "cosine", 10)
  again = optimizers.Warmup(**warmup.get_config())
  assert [float(again(i)) for i in range(11)] == [float(warmup(i))
                                                  for i in range(11)]


def test_the_rate_is_not_in_the_checkpoint(tmp_path):
  c = lc.default_config().optimizer
  c.name, c.momentum, c.learning_rate, c.warmup_steps = "sgd", 0.0, 0.1, 2
  w = tf.Variable([0.0])
  opt = optimizers.build(c, total_steps=10, global_batch_size=32)
  for _ in range(3):
    opt.apply_gradients([(tf.constant([1.0]), w)])
  path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "c"))
  keys = {k for k in tf.train.load_checkpoint(path).get_variable_to_shape_map()
          if k.startswith("optimizer/")}
  assert keys == {"optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
                  "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"}
  c.learning_rate = 0.5  # a resume with a new rate uses it at once
  again = optimizers.build(c, total_steps=10, global_batch_size=32)
  again.build([w])
  tf.train.Checkpoint(optimizer=again).restore(path).assert_consumed()
  assert int(again.iterations.numpy()) == 3
  assert float(again.learning_rate) == pytest.approx(0.5)


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
  """And the health figures see its square before the clip (25, not 1)."""
  with tf.distribute.get_strategy().scope():
    variables = [tf.Variable([0.0]), tf.Variable(tf.zeros([3, 1]))]
    sgd = keras.optimizers.SGD(1.0)
    opt = keras.optimizers.LossScaleOptimizer(sgd) if scaled else sgd
    opt.build(variables)
  seen = []
  optimizers.after_sum(opt, clip_norm=1.0, observe=seen.append)
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
  np.testing.assert_allclose([float(n) for n in seen], [25.0], rtol=1e-6)


def test_an_update_loss_scaling_skips_is_not_observed():
  """A non-finite gradient: the scale halves, no update, no norm seen (the
  health figures count the updates made)."""
  with tf.distribute.get_strategy().scope():
    w = tf.Variable([1.0])
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    opt.build([w])
  seen = []
  optimizers.after_sum(opt, observe=seen.append)
  scale = float(opt.dynamic_scale.numpy())
  opt.apply_gradients([(tf.constant([np.inf]), w)])
  assert seen == [] and float(w[0]) == 1.0
  assert float(opt.dynamic_scale.numpy()) == scale / 2
  opt.apply_gradients([(tf.constant([2.0 * scale / 2]), w)])
  np.testing.assert_allclose([float(n) for n in seen], [4.0], rtol=1e-6)
  np.testing.assert_allclose(w.numpy(), [-1.0], rtol=1e-6)
