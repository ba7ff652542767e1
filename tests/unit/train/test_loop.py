"""The train loop built from a plain step function, with no Trainer:
hand-written SGD on a linear model (Keras variables, as a model's are),
against the same SGD in eager TensorFlow (the reference), step by step."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper.train import loop as loop_lib
from looper.train import stopping
from tests.fixtures import tiny

MICRO, ACCUM, LR = 8, 2, 0.5  # rows per next(), next()s per step


def _batches():
  x, y = tiny.make_data(64, seed=3)
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      MICRO, drop_remainder=True)  # static shapes: the FLOPs are counted


def _sgd_step(w, b):
  """One SGD update of softmax regression on a batch; its mean loss."""
  def step(batch):
    x, y = batch
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(
          tf.nn.sparse_softmax_cross_entropy_with_logits(y, x @ w + b),
          global_batch_size=MICRO * ACCUM)
    gw, gb = tape.gradient(loss, [w, b])
    w.assign_sub(LR * gw)
    b.assign_sub(LR * gb)
    return loss
  return step


def _variables():
  return (keras.Variable(np.zeros([tiny.FEATURES, tiny.NUM_CLASSES],
                                 np.float32)),
          keras.Variable(np.zeros([tiny.NUM_CLASSES], np.float32)))


def _reference(steps: int):
  """The same updates as a plain eager loop: per-step losses, weights."""
  w, b = _variables()
  step, stream = _sgd_step(w, b), iter(_batches())
  losses = []
  for _ in range(steps):
    parts = [next(stream) for _ in range(ACCUM)]
    losses.append(float(step(tuple(tf.concat(t, 0) for t in zip(*parts)))))
  return np.array(losses, np.float32), w.numpy(), b.numpy()


def test_a_plain_step_function_runs_as_the_eager_loop_does(caplog):
  strategy = tf.distribute.get_strategy()
  w, b = _variables()
  iterator = iter(strategy.experimental_distribute_dataset(_batches()))
  step = tf.Variable(0, dtype=tf.int64)
  calls = tf.Variable(0)  # the per-call work, run once per call
  stop = stopping.StopFlag(strategy)
  loop = loop_lib.TrainLoop(
      _sgd_step(w, b), strategy=strategy, iterator=lambda: iterator,
      stop=stop, steps_per_loop=5, step=step,
      weights=[w, b], batches_per_step=ACCUM,
      on_start=lambda: calls.assign_add(1),
      on_end=lambda ran, values: {"ran": ran, "calls": calls.read_value()})
  got = [loop(5), loop(3)]
  with caplog.at_level(logging.INFO):
    got.append(loop(7))  # more than the buffer holds: it grows, and says so
  assert [r.getMessage() for r in caplog.records
          if "grows the loss buffer" in r.getMessage()] == [
              "A train call of 7 steps grows the loss buffer from 5"
              " (train.steps_per_loop); the train function is traced again"]
  want, want_w, want_b = _reference(15)
  np.testing.assert_allclose(np.concatenate([g[0] for g in got]), want,
                             rtol=1e-6)
  np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(b.numpy(), want_b, rtol=1e-6, atol=1e-7)
  assert [(g[1]["ran"], g[1]["calls"], g[2]) for g in got] == [
      (5, 1, True), (3, 2, True), (7, 3, True)]
  assert int(step.numpy()) == 15
  assert got[0][1]["flops"] > 0  # counted from the traced step
  # A stop requested before a call: it runs no step.
  stop.request("test")
  losses, logs, _ = loop(4)
  assert len(losses) == 0 and logs["ran"] == 0 and int(step.numpy()) == 15


def test_a_step_that_makes_the_weights_infinite_is_reported():
  strategy = tf.distribute.get_strategy()
  w = keras.Variable([1.0])

  def blow_up(batch):
    del batch
    w.assign(w * 1e30)
    return tf.reduce_sum(w)

  iterator = iter(_batches())
  loop = loop_lib.TrainLoop(
      blow_up, strategy=strategy, iterator=lambda: iterator,
      stop=stopping.StopFlag(strategy), steps_per_loop=3,
      step=tf.Variable(0, dtype=tf.int64), weights=[w])
  losses, _, finite = loop(2)
  assert finite is False and np.isinf(w.numpy()).all()
  assert losses[0] == pytest.approx(1e30) and np.isinf(losses[1])
