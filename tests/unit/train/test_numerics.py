"""Numerics: dropout masks, mixed precision (and its all-replica finiteness
vote), XLA per step, accumulation, the weight average, train.deterministic.
(The same numerics on 1/2 replicas: tests/e2e/replicas/test_replicas.py;
4: python -m tests.stress.replicas.)"""

import subprocess
import sys
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import run
from looper.options import distribute
from looper.train import layers
from looper.train import trainer as trainer_lib
from looper.options import precision
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures import private_home
from tests.fixtures.configs import SESSION_CPUS
from tests.fixtures.events import curve
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV


def test_dropout_masks_differ_between_examples_and_steps():
  layer = layers.Dropout(0.5, seed=3)
  ones = tf.ones([64, 32])
  first, second = layer(ones, training=True), layer(ones, training=True)
  kept = first.numpy() != 0
  assert 0.4 < kept.mean() < 0.6
  assert len({row.tobytes() for row in kept}) == 64  # no two rows alike
  assert not np.array_equal(kept, second.numpy() != 0)
  np.testing.assert_allclose(first.numpy()[kept], 2.0)  # inverted dropout
  np.testing.assert_array_equal(layer(ones, training=False), ones)


def _trainer(**fields):
  c = tiny.get_config()
  for key, value in fields.items():
    if "__" in key:
      section, name = key.split("__")
      c[section][name] = value
    else:
      c[key] = value
  return pieces.trainer(c, tf.distribute.get_strategy())


def test_jit_compile_matches_the_plain_step():
  plain = _trainer()
  xla = _trainer(train__jit_compile=True)
  np.testing.assert_allclose(xla.train(15)[0]["loss"],
                             plain.train(15)[0]["loss"], rtol=1e-5)


@pytest.mark.parametrize("name", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_and_keeps_float32_weights(name):
  t = _trainer(train__precision=name)
  assert t.model.layers[0].compute_dtype == name.split("_")[1]
  assert {v.dtype for v in t.model.weights} == {"float32"}
  losses = np.concatenate([t.train(20)[0]["loss"] for _ in range(3)])
  assert np.isfinite(losses).all() and losses[-10:].mean() < losses[:10].mean()
  # The global policy is untouched: the next model is float32 again.
  assert keras.mixed_precision.global_policy().name == "float32"


def test_checkpoints_move_between_precisions(tmp_path):
  bf16 = _trainer(train__precision="mixed_bfloat16")
  bf16.train(10)
  path = tf.train.Checkpoint(**bf16.checkpoint_items()).save(
      str(tmp_path / "c"))
  for name in ("float32", "mixed_float16"):
    other = _trainer(train__precision=name)
    tf.train.Checkpoint(**other.checkpoint_items()).restore(
        path).assert_existing_objects_matched()
    for a, b in zip(bf16.model.weights, other.model.weights):
      np.testing.assert_array_equal(a.numpy(), b.numpy())


class InfOnReplicaOne(trainer_lib.Trainer):
  """A gradient of inf on replica 1 alone, at the third step."""

  def compute_gradients(self, inputs, labels):
    loss, grads, logits = super().compute_gradients(inputs, labels)
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    bad = tf.logical_and(tf.equal(replica, 1),
                         tf.equal(self.step, 2))  # the 3rd step
    grads[0] = grads[0] + tf.where(bad, np.float32(np.inf), np.float32(0))
    return loss, grads, logits


def _python(code: str) -> list[str]:
  """The lines `code` prints, run in a fresh Python with looper."""
  env = dict(LOOPBACK_ENV, **private_home.env(), PYTHONPATH=PYTHONPATH,
             PATH="/usr/bin:/bin")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout.strip().splitlines()


@pytest.mark.slow  # 2 replicas: seconds
def test_an_inf_on_replica_one_skips_the_step_on_every_replica():
  strategy = distribute.mirrored(distribute.split_cpu(SESSION_CPUS))
  c = tiny.get_config()
  c.train.precision = "mixed_float16"
  c.train.grad_norm = True
  t = pieces.trainer(c, strategy, InfOnReplicaOne)

  def weights():
    return [[r.numpy() for r in strategy.experimental_local_results(v.value)]
            for v in t.model.trainable_variables]
  _, updated = t.train(2)
  before, scale_before = weights(), float(t.optimizer.dynamic_scale.numpy())
  _, skipped = t.train(1)  # the update with an inf on replica 1 only
  after = weights()
  _, resumed = t.train(3)
  end = weights()
  # The health figures take the gradient's norm inside loss scaling's
  # branch (health.Health.observe) and count the updates made: none in
  # the skipped step's loop.
  assert skipped["grad_norm"] == skipped["grad_norm_max"] == 0.0
  assert skipped["update_ratio"] == 0.0
  for logs in (updated, resumed):
    assert 0 < logs["grad_norm"] <= logs["grad_norm_max"] < 100, logs
  # Skipped on every replica: no weight moved, the replicas still equal.
  assert all(np.array_equal(a, b) for v, w in zip(before, after)
             for a, b in zip(v, w))
  assert all(np.array_equal(v[0], v[1]) for v in end)
  assert all(np.isfinite(r).all() for v in end for r in v)
  # Training goes on after the skipped step, at a lower loss scale.
  assert not all(np.array_equal(a[0], b[0]) for a, b in zip(after, end))
  assert float(t.optimizer.dynamic_scale.numpy()) < scale_before


@pytest.mark.parametrize("embed", [0, 8])  # 8: an Embedding's sparse grads
def test_gradient_accumulation_equals_one_larger_batch(embed):
  big = _trainer(train__batch_size=64, model__embed=embed)
  small = _trainer(train__batch_size=16, train__grad_accum_steps=4,
                   model__embed=embed)
  np.testing.assert_allclose(small.train(12)[0]["loss"],
                             big.train(12)[0]["loss"], rtol=1e-5)
  for a, b in zip(small.model.weights, big.model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
  assert small.global_step == big.global_step == 12
  assert small.input.data_position == big.input.data_position == 12 * 64
  assert small.learning_rate() == big.learning_rate()


def test_ema_follows_a_numpy_reference_and_is_what_eval_sees():
  decay = 0.8
  t = _trainer(optimizer__ema_decay=decay)
  average = [v.numpy() for v in t.model.trainable_variables]
  for _ in range(5):
    t.train(1)
    average = [decay * a + (1 - decay) * v.numpy()
               for a, v in zip(average, t.model.trainable_variables)]
  for got, want in zip(t.ema.averages, average):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)
  trained = [v.numpy() for v in t.model.trainable_variables]
  logs = pieces.evaluator(t).evaluate()
  for v, want in zip(t.model.trainable_variables, trained):  # swapped back
    np.testing.assert_array_equal(v.numpy(), want)
  # The same evaluation with the averaged weights loaded by hand.
  plain = _trainer()
  for v, a in zip(plain.model.trainable_variables, average):
    v.assign(a)
  assert logs["loss"] == pytest.approx(pieces.evaluator(plain).evaluate()["loss"], rel=1e-6)
  assert "ema" in t.checkpoint_items()


@pytest.mark.parametrize("name", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.slow  # over 2 s: out of the fast lane
def test_mixed_precision_resumes_exactly(tmp_path, name):
  from looper import run  # pylint: disable=g-import-not-at-top
  def config(steps):
    c = tiny.get_config()
    c.train.precision, c.train.steps = name, steps
    c.eval.every_steps = c.checkpoint.every_steps = 10
    return c
  run.run(config(20), str(tmp_path / "whole"), "train")
  run.run(config(10), str(tmp_path / "parts"), "train")
  run.run(config(20), str(tmp_path / "parts"), "train")
  np.testing.assert_array_equal(curve(tmp_path / "parts" / "train"),
                                curve(tmp_path / "whole" / "train"))


def test_random_flip_mirrors_about_half_of_the_images_in_training_only():
  images = tf.reshape(tf.range(6 * 2 * 3 * 1, dtype=tf.float32), [6, 2, 3, 1])
  images = tf.tile(images, [10, 1, 1, 1])  # 60 distinct-enough images
  flip = layers.RandomFlip(seed=3)
  first, second = flip(images, training=True), flip(images, training=True)
  mirrored = tf.reverse(images, axis=[2])
  for out in (first, second):
    same = tf.reduce_all(tf.equal(out, images), axis=[1, 2, 3]).numpy()
    flipped = tf.reduce_all(tf.equal(out, mirrored), axis=[1, 2, 3]).numpy()
    assert (same ^ flipped).all()  # each image whole: kept or mirrored
    assert 15 < flipped.sum() < 45
  assert not np.array_equal(first, second)  # a new draw per call
  np.testing.assert_array_equal(flip(images, training=False), images)


_DETERMINISTIC = """
import tensorflow as tf
from tensorflow.python.framework import config
from looper.options import precision
def show():
  print(config.is_op_determinism_enabled(),
        tf.config.experimental.tensor_float_32_execution_enabled())
tf.config.experimental.enable_tensor_float_32_execution(False)  # by hand
precision.set_deterministic(False)
show()
for on in (True, False):
  precision.set_deterministic(on)
  show()
"""


@pytest.mark.slow  # a subprocess: both settings are process-wide
def test_deterministic_turns_op_determinism_on_and_tf32_off_and_back():
  # Off leaves the user's own TF32 setting; after a deterministic run it
  # restores TensorFlow's defaults.
  assert _python(_DETERMINISTIC) == ["False False", "True False",
                                     "False True"]


def test_a_run_sets_determinism_before_it_builds_the_strategy(tmp_path):
  calls = []

  class Built(Exception):
    pass

  def strategy_for(config):
    calls.append("strategy_for")
    raise Built

  c = tiny.get_config()
  c.train.deterministic = True
  with mock.patch.object(precision, "set_deterministic", calls.append), \
       mock.patch.object(distribute, "strategy_for", strategy_for), \
       pytest.raises(Built):
    run.run(c, str(tmp_path), "train")
  assert calls == [True, "strategy_for"]
