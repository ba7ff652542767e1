"""CPU proxies for what only a GPU or TPU would run: XLA over the whole
replica step (as a TPU compiles it), a replica id that is a runtime
tensor, a compile failure told apart from bad data.

A TPU compiles each replica's whole step with XLA; here the same step
(forward, backward, update, weight average, metrics, the loss buffer's
write) is compiled with jit_compile on the CPU and must give the plain
step's losses and weights. The loop graph's own TPU/GPU facts (whole
variable writes, no per-variable merge call, no collective outside the
step under several workers) are in tests/e2e/replicas/test_loop_graph.py.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper.train import layers
from looper.options import precision
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.events import curve
from tests.fixtures.processes import run_ok

# Every option a replica step carries: the weight average, a clip,
# accumulation, class weights with per-weight normalization, an Embedding.
OPTIONS = {"optimizer.ema_decay": 0.9, "optimizer.clip_global_norm": 0.3,
           "train.grad_accum_steps": 2, "data.class_weights": (1, 2, 1, 3),
           "loss_normalization": "weights", "model.embed": 8,
           "optimizer.learning_rate": 0.5}


@pytest.fixture(name="compiled_step")
def _compiled_step(monkeypatch):
  """Makes a trainer's replica step and each replica's weight check
  XLA-compiled, as a TPU runs them (set before the first trace)."""
  monkeypatch.setattr(precision, "_bad",
                      tf.function(precision._bad, jit_compile=True))  # pylint: disable=protected-access
  def compiled(trainer):
    step = trainer._loop  # pylint: disable=protected-access
    step._train_step = tf.function(step._train_step, jit_compile=True)  # pylint: disable=protected-access
    return trainer
  return compiled


def _trainer(fields):
  strategy = tf.distribute.get_strategy()
  return pieces.trainer(configured(tiny.get_config(), fields), strategy)


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_the_whole_replica_step_compiles_and_matches_the_plain_step(
    compiled_step):
  plain = _trainer(OPTIONS)
  xla = compiled_step(_trainer(OPTIONS))
  want = np.concatenate([plain.train(5)[0]["loss"], plain.train(5)[0]["loss"]])
  got = np.concatenate([xla.train(5)[0]["loss"], xla.train(5)[0]["loss"]])
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert xla.weights_finite
  for a, b in zip(xla.ema.averages + xla.model.weights,
                  plain.ema.averages + plain.model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
  accuracy = [float(t.train_metrics.results()["accuracy"])
              for t in (xla, plain)]
  assert accuracy[0] == pytest.approx(accuracy[1])


@pytest.mark.parametrize("replicas", [2, 4])
def test_noise_rows_by_a_runtime_replica_id_compile_and_tile_the_draw(
    replicas):
  seed = tf.constant([3, 4], tf.int64)
  rows = tf.function(layers.rows_of_global_draw, jit_compile=True)
  shape = tf.constant([5, 3])
  # The replica id as a tensor argument: unknown when XLA compiles.
  parts = [rows(seed, shape, tf.constant(r), replicas)
           for r in range(replicas)]
  whole = rows(seed, tf.constant([5 * replicas, 3]), tf.constant(0), 1)
  np.testing.assert_array_equal(tf.concat(parts, 0), whole)


class _OnTheHost(keras.layers.Layer):
  """Identity through numpy: an op (PyFunc) XLA cannot compile."""

  def call(self, x):
    return tf.ensure_shape(tf.numpy_function(lambda v: v, [x], tf.float32),
                           x.shape)


def _host_model(config):
  del config
  return keras.Sequential([keras.Input((tiny.FEATURES,)), _OnTheHost(),
                           keras.layers.Dense(tiny.NUM_CLASSES)])


@pytest.mark.parametrize("where, message", [
    ("jit_compile", "config.train.jit_compile=True: the train step does not"
     " compile with XLA (op PyFunc is not supported); set"
     " --config.train.jit_compile=False, or replace that op in the model"),
    # The whole step compiled, as on a TPU: not called a data error.
    ("whole step", "the step does not compile with XLA for this accelerator"
     " (op PyFunc is not supported); replace that op in the model (`looper"
     " check --config=...` lists every such op, on any machine)")])
def test_an_op_xla_cannot_compile_is_one_line_naming_it(where, message,
                                                       compiled_step):
  fields = {"model_fn": _host_model,
            "train.jit_compile": where == "jit_compile"}
  trainer = _trainer(fields)
  if where == "whole step":
    trainer = compiled_step(trainer)
  with pytest.raises(lc.ConfigError) as e:
    trainer.train(2)
  assert str(e.value) == message


# looper's command line, then what the run left set in its process: op
# determinism (public only as the ops it refuses: tf.timestamp) and TF32.
_RUN_AND_REPORT = """
import json
import tensorflow as tf
from looper import main
try:
  main.cli()
except SystemExit as e:  # absl's app.run ends with it
  assert not e.code, e.code
try:
  tf.timestamp()
  determinism = False
except tf.errors.FailedPreconditionError:
  determinism = True
print(json.dumps({"op_determinism": determinism, "tf32":
                  tf.config.experimental.tensor_float_32_execution_enabled()}))
"""


@pytest.mark.slow  # two looper processes (op determinism is process-wide)
def test_a_deterministic_run_repeats_itself_bit_for_bit(tmp_path):
  args = ("--config=tests/fixtures/tiny.py",
          "--config.train.deterministic=True",
          "--config.model.dropout=0.3", "--config.train.steps=20")
  for run in ("a", "b"):
    out = run_ok(*args, f"--workdir={tmp_path / run}", code=_RUN_AND_REPORT)
    # What the flag sets (TensorFlow's defaults are the other way round).
    assert json.loads(out.stdout.splitlines()[-1]) == {
        "op_determinism": True, "tf32": False}, out.stdout[-2000:]
  np.testing.assert_array_equal(curve(tmp_path / "a" / "train"),
                                curve(tmp_path / "b" / "train"))
  loops = [json.loads(line) for line in
           (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
           if '"train"' in line]
  # Op determinism refuses tf.timestamp: no input-wait figure, not a 0.
  assert loops and all("input_wait_fraction" not in l for l in loops)
  assert all("steps_per_sec" in l for l in loops)
