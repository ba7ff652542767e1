"""Keras' own random layers keep looper's contracts (looper.train.randomness).

- Resume: a model of every adopted layer (tests/fixtures/tiny.py
  keras_random_model) stopped and restored draws what the uninterrupted run
  drew, bit for bit; restored without its random state it does not (so the check
  can fail).
- Replica invariance: each layer's output on 2 replicas is, row for row,
  its output on the whole batch on one device; the model's loss curve is
  the same on 1 and 2 replicas (the session's 2 logical CPUs).
- Draws looper cannot reach are named by train's header, describe and
  check; a workdir written before random states were saved still resumes.
(kill -9 at random moments: tests/stress/kill9.py runs this model.)
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import workdir
from looper.cli import describe
from looper.cli import tpu_check
from looper.train import randomness
from looper.workdir import checkpoint
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.configs import SESSION_CPUS, configured

# Every adopted layer of keras_random_model and the Dropout inside its
# MultiHeadAttention: 8 random states.
STATES = 8


def _config(**fields):
  return configured(tiny.get_config(), {
      "model.keras_random": True, "data.shuffle_buffer": 0,
      "train.batch_size": 16, **fields})


def _checkpointer(trainer, root, items=None):
  return checkpoint.Checkpointer(
      workdir.Workdir(str(root)), items or trainer.checkpoint_items(),
      keep=3, chief=True, task_id=0)


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_every_random_state_is_saved_and_a_resume_draws_on(tmp_path):
  whole = pieces.trainer(_config(), tf.distribute.get_strategy())
  start = [s.numpy().copy() for s in whole.random.states.values()]
  want = whole.train(12)[0]["loss"]
  assert len(whole.random.states) == STATES
  assert whole.random.unreachable == []
  assert list(whole.random.states)[:2] == ["000_Dropout", "001_GaussianNoise"]
  for before, state in zip(start, whole.random.states.values()):
    assert not np.array_equal(before, state.numpy())  # each layer drew

  first = pieces.trainer(_config(), tf.distribute.get_strategy())
  np.testing.assert_array_equal(first.train(6)[0]["loss"], want[:6])
  _checkpointer(first, tmp_path).save(6, sync=True)
  resumed = pieces.trainer(_config(), tf.distribute.get_strategy())
  assert _checkpointer(resumed, tmp_path).restore()
  np.testing.assert_array_equal(resumed.train(6)[0]["loss"], want[6:])
  for a, b in zip(whole.random.states.values(),
                  resumed.random.states.values()):
    np.testing.assert_array_equal(a.numpy(), b.numpy())

  # What the checkpoint used to hold: the draws of step 1 again.
  replayed = pieces.trainer(_config(), tf.distribute.get_strategy())
  items = replayed.checkpoint_items()
  del items["random"]
  _checkpointer(replayed, tmp_path, items).restore()
  assert not np.array_equal(replayed.train(6)[0]["loss"], want[6:])


def test_a_workdir_saved_without_random_states_resumes_and_says_so(
    tmp_path, caplog):
  old = pieces.trainer(_config(), tf.distribute.get_strategy())
  old.train(3)
  items = old.checkpoint_items()
  del items["random"]  # as looper wrote it before
  prefix = _checkpointer(old, tmp_path, items).save(3, sync=True)
  new = pieces.trainer(_config(), tf.distribute.get_strategy())
  with caplog.at_level(logging.WARNING):
    assert _checkpointer(new, tmp_path).restore() == prefix
  assert new.global_step == 3
  np.testing.assert_array_equal(new.model.weights[0].numpy(),
                                old.model.weights[0].numpy())
  said = [r.getMessage() for r in caplog.records if "random" in
          r.getMessage()]
  assert said == [
      f"{prefix} was written without the model's random layers' state, so"
      " their draws start again from their seeds (exact resume holds from"
      " the next checkpoint on)."]


class _OwnNoise(keras.layers.Layer):
  """A user's layer drawing with keras.random from its own generator."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.generator = keras.random.SeedGenerator(5)

  def call(self, x, training=False):
    return x + keras.random.normal(tf.shape(x), seed=self.generator) if (
        training) else x


def _unreachable_model(config):
  return keras.Sequential([
      keras.Input((tiny.FEATURES,)), keras.layers.Reshape((4, 2)),
      keras.layers.LSTM(8, dropout=0.2, name="lstm"),
      _OwnNoise(name="own_noise"), keras.layers.Dropout(0.1),
      keras.layers.Dense(tiny.NUM_CLASSES)])


NOTE = (
    "random draws looper cannot make replica-invariant: layer 'lstm_cell'"
    " (LSTMCell), layer 'own_noise' (_OwnNoise); they draw the same numbers"
    " on every replica, so the loss curve depends on the replica count"
    " (resume stays exact). Use keras.layers.Dropout between layers instead"
    " of a recurrent layer's dropout=, or looper.train.layers")


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_draws_looper_cannot_reach_are_named_by_describe_and_check(
    tmp_path):
  config = configured(tiny.get_config(), {"train.batch_size": 64})
  config.model_fn = _unreachable_model
  trainer = pieces.trainer(config, tf.distribute.get_strategy())
  # Their states are saved all the same: the LSTM's, the layer's, Dropout's.
  assert len(trainer.checkpoint_items()["random"]) == 3
  assert trainer.random.note() == NOTE
  assert f"\n  note       {NOTE}\n" in describe.describe(config)
  notes = []
  problems = tpu_check.check(config, notes=notes)
  assert notes == [NOTE]
  lines = tpu_check.report(problems, config, 8, notes).splitlines()
  assert lines[0].startswith("ready: ")  # a note, not a problem
  assert lines[1] == f"note: {NOTE}"
  # A model of adopted layers only has nothing to say.
  assert pieces.trainer(
      _config(), tf.distribute.get_strategy()).random.note() is None


@pytest.mark.slow  # 2 replicas: seconds
def test_one_and_two_replicas_draw_the_same():
  out = _one_and_two()
  for name, (one, two) in out["layers"].items():
    np.testing.assert_allclose(two, one, rtol=1e-6, atol=1e-6,
                               err_msg=name)
    assert not np.allclose(one, out["inputs"][name], atol=1e-3), name
  np.testing.assert_allclose(out["curve"][1], out["curve"][0], rtol=1e-5)
  # Dropout on a tensor whose first axis is not the examples: Keras' own
  # draw, said once.
  assert out["not_examples"] == [
      "Layer 'kernel_dropout' draws on a tensor of shape [3, 16], whose first"
      " axis is not a replica's 4 examples: its draws are the same on every"
      " replica, so the loss curve depends on the replica count."]


def _layer_cases():
  """(name, a layer factory, an input batch of 8) per adopted layer, and
  the attention whose Dropout is inside it."""
  L = keras.layers  # pylint: disable=invalid-name
  rng = np.random.default_rng(0)
  flat = rng.normal(size=(8, 16)).astype(np.float32)
  image = rng.normal(size=(8, 4, 4, 3)).astype(np.float32)
  volume = rng.normal(size=(8, 2, 2, 2, 3)).astype(np.float32)
  sequence = rng.normal(size=(8, 5, 4)).astype(np.float32)
  attention = lambda: L.MultiHeadAttention(2, 4, dropout=0.5, seed=1)
  return {
      "Dropout": (lambda: L.Dropout(0.5, seed=1), flat),
      "Dropout(noise_shape)": (
          lambda: L.Dropout(0.5, noise_shape=(None, 1, 4), seed=1), sequence),
      "SpatialDropout1D": (lambda: L.SpatialDropout1D(0.5, seed=1),
                           sequence),
      "SpatialDropout2D": (lambda: L.SpatialDropout2D(0.5, seed=1), image),
      "SpatialDropout3D": (lambda: L.SpatialDropout3D(0.5, seed=1), volume),
      "GaussianNoise": (lambda: L.GaussianNoise(0.5, seed=1), flat),
      "GaussianDropout": (lambda: L.GaussianDropout(0.5, seed=1), flat),
      "AlphaDropout": (lambda: L.AlphaDropout(0.5, seed=1), flat),
      "RandomFlip": (lambda: L.RandomFlip("horizontal", seed=1), image),
      "MultiHeadAttention": (attention, sequence),
  }


def _apply(make, x, strategy):
  """The layer's training output for batch `x` under `strategy`, twice
  (the second draw must follow the first)."""
  keras.utils.set_random_seed(0)  # the attention's kernels
  rows = len(x) // strategy.num_replicas_in_sync
  with strategy.scope():
    layer = make()
    wrapper = keras.Sequential([keras.Input(x.shape[1:]), layer]) if not (
        isinstance(layer, keras.layers.MultiHeadAttention)) else None
    if wrapper is None:
      layer(x, x)
      randomness.adopt(layer, rows)
      call = lambda v: layer(v, v, training=True)
    else:
      randomness.adopt(wrapper, rows)
      call = lambda v: layer(v, training=True)
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensors(x))

  @tf.function
  def step(batch):
    out = strategy.run(lambda v: (call(v), call(v)), args=(batch,))
    return [tf.concat(strategy.experimental_local_results(o), 0)
            for o in out]

  return [o.numpy().tolist() for o in step(next(iter(dataset)))]


def _one_and_two() -> dict:
  """Each adopted layer's draws, and a run's curve, on 1 replica and on the
  session's 2 logical CPUs (tests/conftest.py); what a non-example draw
  logs."""
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  two = distribute.mirrored(distribute.split_cpu(SESSION_CPUS))
  one = tf.distribute.get_strategy()
  layers, inputs = {}, {}
  for name, (make, x) in _layer_cases().items():
    layers[name] = (_apply(make, x, one), _apply(make, x, two))
    inputs[name] = [x.tolist(), x.tolist()]
  curve = [pieces.trainer(_config(), s).train(8)[0]["loss"].tolist()
           for s in (one, two)]
  said = []
  handler = logging.Handler()
  handler.emit = lambda record: said.append(record.getMessage())
  logging.getLogger("absl").addHandler(handler)
  try:
    with two.scope():
      layer = keras.layers.Dropout(0.5, name="kernel_dropout")
      randomness.adopt(layer, rows=4)
    two.run(tf.function(lambda: layer(tf.ones([3, 16]), training=True)))
  finally:
    logging.getLogger("absl").removeHandler(handler)
  return {"layers": layers, "inputs": inputs, "curve": curve,
          "not_examples": said}
