"""model.remat (experiments/text/model.py's Block): the same training with
less activation memory.

The train-loss curves of looper's Trainer with and without remat, on 2
replicas (in their own process: logical CPUs are set before TensorFlow
starts; replica-invariant dropout is the case where a replay could miss), with dropout on both residual branches and in the
attention, AdamW and clipping: bitwise equal in graph mode, where the
recomputation runs the forward pass's kernels on the same inputs (the
data dependency tf.recompute_grad adds is x + 0.0) and the dropouts'
random state is replayed; within 1e-6 under XLA (train.jit_compile, one
replica), which fuses the recomputing graph differently (gradients differ
by ~1 ulp).
Keras' RematScope is not used: inside a tf.function it fails on every
layer called with `training` (keras-team/keras#21207) and would redraw
the dropout masks. Peak memory is TensorFlow's CPU allocator's count, in a
process whose allocator keeps one (processes.MEMORY_STATS_ENV).
"""

import json
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from experiments import lm
from experiments.text import model
from looper import config as lc
from tests.fixtures import forks
from tests.fixtures import pieces
from tests.fixtures.configs import configured
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV, MEMORY_STATS_ENV

# Small: one block (each of its dropouts and its recomputation: what a
# second block would repeat; traces and XLA's compile are this file's
# time) of width 16 over windows of 16 random bytes.
FIELDS = {"model.layers": 1, "model.heads": 2, "model.width": 16,
          "model.context": 16, "model.dropout": 0.1,
          "model.attention_dropout": 0.1, "train.batch_size": 8,
          "train.steps_per_loop": 12, "optimizer.warmup_steps": 2,
          "train.jit_compile": False}  # bitwise; XLA's own test below
STEPS = 12


def _config(**fields):
  c = configured(lm.get_config(), {**FIELDS, **fields})
  context = c.model.context
  stream = np.random.default_rng(0).integers(
      0, 256, 64 * context + 1).astype(np.int32)
  rows = np.arange(64)[:, None] * context + np.arange(context)
  c.dataset_fn = lambda config, split: (stream[rows], stream[rows + 1])
  return c


def _curve(strategy, **fields) -> np.ndarray:
  keras.utils.set_random_seed(0)  # the same initial weights
  return pieces.trainer(_config(**fields), strategy).train(STEPS)[0]["loss"]


def test_remat_is_a_declared_boolean_off_by_default():
  c = lm.get_config()
  assert c.model.remat is False
  blocks = [l for l in lm.model_fn(c).layers if isinstance(l, model.Block)]
  assert len(blocks) == 4 and not any(b.remat for b in blocks)
  c.model.remat = True
  assert all(b.remat for b in lm.model_fn(c).layers
             if isinstance(b, model.Block))
  with c.model.ignore_type():  # as a config file could set it
    c.model.remat = 1
  with pytest.raises(lc.ConfigError) as e:
    lc.validate(c)
  assert str(e.value) == ("config.model.remat=1: must be True or False; set"
                          " --config.model.remat")


@pytest.mark.slow  # compiles for seconds
def test_under_xla_the_curve_with_remat_is_within_1e_6():
  strategy = tf.distribute.get_strategy()
  xla = {"train.jit_compile": True}
  np.testing.assert_allclose(
      _curve(strategy, **xla, **{"model.remat": True}),
      _curve(strategy, **xla), rtol=1e-6)


def test_the_curves_above_draw_dropout_masks():
  """What makes the bitwise test above mean something: FIELDS' model
  drops units in training (two calls differ), so remat had masks to
  replay."""
  net = lm.model_fn(_config())
  x = np.random.default_rng(2).integers(0, 256, (2, 16)).astype(np.int32)
  first, second = (net(x, training=True).numpy() for _ in range(2))
  assert np.abs(first - second).max() > 1e-4
  np.testing.assert_array_equal(net(x).numpy(), net(x).numpy())


def _peak_bytes_of_a_gradient(remat: bool) -> tuple[int, list]:
  """TensorFlow's peak allocation on CPU:0 during one gradient (traced
  before) over what was allocated when it started, and the gradients; in
  a process started with MEMORY_STATS_ENV."""
  c = configured(lm.get_config(), {
      "model.layers": 4, "model.heads": 2, "model.width": 32,
      "model.context": 128, "model.remat": remat})
  keras.utils.set_random_seed(0)
  model = lm.model_fn(c)
  x = tf.constant(np.random.default_rng(1).integers(
      0, 256, (8, 129)).astype(np.int32))

  @tf.function
  def gradients(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
          x[:, 1:], model(x[:, :-1], training=True), from_logits=True))
    return tape.gradient(loss, model.trainable_variables)

  gradients(x)
  tf.config.experimental.reset_memory_stats("CPU:0")
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  grads = gradients(x)
  return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before, [
      g.numpy() for g in grads]


# One process for the two tests that need their own (logical CPUs, the
# allocator's count: both set before TensorFlow starts): the peaks first,
# while nothing else is allocated, then the curves on 2 replicas.
_OWN_PROCESS = """
import json, sys
import numpy as np
import tensorflow as tf
from looper.options import distribute
from tests.unit.experiments import test_lm_remat as t
devices = distribute.split_cpu(2)
peaks = []
for remat in (False, True):
  peak, grads = t._peak_bytes_of_a_gradient(remat)
  np.savez(f"{sys.argv[1]}/{remat}.npz", *grads)
  peaks.append(peak)
strategy = tf.distribute.MirroredStrategy(devices)
print(json.dumps({"peaks": peaks, "curves": [
    t._curve(strategy, **fields).tolist() for fields in (
        {}, {"model.remat": True})]}))
"""


@pytest.fixture(scope="module")
def own_process(tmp_path_factory):
  """The output of _OWN_PROCESS and the folder of its gradients."""
  out = tmp_path_factory.mktemp("remat")
  proc = forks.run(
      [sys.executable, "-c", _OWN_PROCESS, str(out)], cwd=ROOT, timeout=600,
      env={**os.environ, "PYTHONPATH": PYTHONPATH, **LOOPBACK_ENV,
           **MEMORY_STATS_ENV})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1]), out


@pytest.mark.slow  # its own process
def test_on_2_replicas_the_curve_with_remat_is_bitwise_the_curve_without(
    own_process):
  without, with_remat = map(np.array, own_process[0]["curves"])
  assert len(without) == STEPS and np.isfinite(without).all()
  np.testing.assert_array_equal(with_remat, without)


@pytest.mark.slow  # its own process
def test_remat_keeps_fewer_activations_for_the_same_gradients(own_process):
  (without, with_remat), out = own_process[0]["peaks"], own_process[1]
  grads, remat_grads = (
      [z[f"arr_{i}"] for i in range(len(z.files))]
      for z in map(np.load, (out / "False.npz", out / "True.npz")))
  assert len(grads) == len(remat_grads) > 0
  for a, b in zip(grads, remat_grads):
    np.testing.assert_array_equal(a, b)
  # 4 blocks: the backward pass holds one block's activations at a time,
  # not 4 blocks' (measured: 0.44 of the bytes on an Intel Xeon with AMX,
  # 0.32 on an AMD EPYC).
  assert with_remat < 0.6 * without, (with_remat, without)
