"""distribution.shard_optimizer: the sharded run is the replicated run.

Against the reference of the same trainer unsharded, on the session's 2
logical CPUs: per-step losses and final weights, the optimizer state per
device, and checkpoints in one layout: sharded <-> replicated, 2
replicas -> 1. On one replica the flag costs nothing: the weights are
updated in place, as unsharded.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from unittest import mock

from looper.errors import ConfigError
from looper.options import distribute
from looper.options import optimizer_state
from looper.options import sharding
from looper.train import trainer as trainer_lib
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.configs import SESSION_CPUS, configured

STEPS = 8


class ExcludedFromDecay(trainer_lib.Trainer):
  """AdamW that decays neither biases (by name) nor the first kernel (by
  variable): both of Keras' ways."""

  def build_optimizer(self):
    optimizer = super().build_optimizer()
    optimizer.exclude_from_weight_decay(
        var_list=[self.model.trainable_variables[0]], var_names=["bias"])
    return optimizer


class Constrained(trainer_lib.Trainer):
  """A max-norm on the last kernel: Keras applies it to the whole weight
  after each update, which binds from the first steps."""

  def build_model(self):
    model = super().build_model()
    model.layers[-1].kernel.constraint = keras.constraints.MaxNorm(0.3)
    return model


# name -> (config fields, Trainer class).
CASES = {
    # Its first kernel (8 x 4096 float32) gathered alone, the rest
    # together (sharding.ALONE).
    "adam": ({"optimizer.name": "adam", "optimizer.clip_global_norm": 0.5,
              "optimizer.ema_decay": 0.9, "model.width": 4096},
             trainer_lib.Trainer),
    # An Embedding: sparse gradients, duplicate rows (see _sparse_slice).
    "adamw": ({"optimizer.name": "adamw", "optimizer.weight_decay": 0.3,
               "optimizer.learning_rate": 0.05, "model.embed": 4},
              ExcludedFromDecay),
    "sgd": ({"optimizer.momentum": 0.9, "train.grad_accum_steps": 2},
            trainer_lib.Trainer),
    "constrained": ({"optimizer.name": "adam"}, Constrained),
}


# Optimizer slots per weight (Adam's two moments; SGD's momentum).
SLOTS = {"sgd": 1}


def _trainer(strategy, case: str, shard: bool, cls=None):
  config = configured(tiny.get_config(), CASES[case][0],
                      distribution__shard_optimizer=shard)
  return pieces.trainer(config, strategy, cls or CASES[case][1])


def _weights(trainer) -> list:
  return [v.numpy().tolist() for v in trainer.model.trainable_variables]


def _run(trainer) -> dict:
  """STEPS steps: the losses, the weights and their average (EMA, swapped
  in as eval does), after which the weights must be back."""
  run = dict(losses=trainer.train(STEPS)[0]["loss"].tolist(),
             weights=_weights(trainer))
  if trainer.ema:
    with trainer.ema.swapped():
      run["averaged"] = _weights(trainer)
    assert _weights(trainer) == run["weights"]
  return run


def _state_bytes(trainer, strategy) -> list[int]:
  return list(optimizer_state.state_bytes(
      strategy, trainer.update.optimizer.variables).values())


def results(strategy, directory: str) -> dict:
  """Each case replicated and sharded; Adam's checkpoints across."""
  out = {}
  for case in CASES:
    for shard in (False, True):
      t = _trainer(strategy, case, shard)
      out[f"{case}/{shard}"] = dict(_run(t), bytes=_state_bytes(t, strategy))
      if case == "adam":  # save, then go on: what a restore must give
        path = tf.train.Checkpoint(**t.checkpoint_items()).write(
            f"{directory}/{shard}")
        out[f"adam/{shard}"]["path"] = path
        out[f"adam/{shard}"]["on"] = t.train(STEPS)[0]["loss"].tolist()
  for shard in (False, True):  # the other's checkpoint, and on
    t = _trainer(strategy, "adam", shard)
    tf.train.Checkpoint(**t.checkpoint_items()).read(
        out[f"adam/{not shard}"]["path"]).assert_existing_objects_matched()
    out[f"adam/{shard}/from_other"] = t.train(STEPS)[0]["loss"].tolist()
  # AdamW decaying every weight: the exclusions must have acted.
  t = _trainer(strategy, "adamw", True, trainer_lib.Trainer)
  t.train(STEPS)
  out["adamw/every_weight_decayed"] = _weights(t)
  return out


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
  """`results` on the session's 2 logical CPUs (tests/conftest.py)."""
  return results(distribute.mirrored(distribute.split_cpu(SESSION_CPUS)),
                 tmp_path_factory.mktemp("sharding"))


def _same_run(got: dict, want: dict, what: str) -> None:
  np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-6,
                             err_msg=what)
  assert ("averaged" in got) == ("averaged" in want)
  for a, b in zip(got["weights"] + got.get("averaged", []),
                  want["weights"] + want.get("averaged", [])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=what)


@pytest.mark.slow  # 2 replicas: seconds
@pytest.mark.parametrize("case", CASES)
def test_two_replicas_sharded_train_as_replicated(two_replicas, case):
  got, want = two_replicas[f"{case}/True"], two_replicas[f"{case}/False"]
  _same_run(got, want, case)
  # The slots on each device: whole replicated, ceil(size / 2) of each
  # weight sharded (float32), and the int64 step counter.
  sizes = [np.size(w) for w in want["weights"]]
  slots = SLOTS.get(case, 2)
  assert want["bytes"] == [8 + slots * 4 * sum(sizes)] * 2
  assert got["bytes"] == [8 + slots * 4 * sum(-(-n // 2) for n in sizes)] * 2
  if case == "constrained":  # it bound: a column at the max norm
    norms = np.linalg.norm(got["weights"][-2], axis=0)
    np.testing.assert_allclose(norms.max(), 0.3, rtol=1e-5)
  if case == "adamw":  # and the exclusions acted: decaying all differs
    assert not all(np.allclose(a, b) for a, b in zip(
        two_replicas["adamw/every_weight_decayed"], got["weights"]))


@pytest.mark.slow  # 2 replicas: seconds
def test_two_replicas_checkpoints_move_between_sharded_and_replicated(
    two_replicas):
  for shard in (False, True):
    np.testing.assert_array_equal(
        two_replicas[f"adam/{shard}/from_other"],
        two_replicas[f"adam/{not shard}"]["on"])
  # Same keys, shapes and values: one layout whatever the sharding.
  rep, sharded = (tf.train.load_checkpoint(two_replicas[f"adam/{s}"]["path"])
                  for s in (False, True))
  shapes = rep.get_variable_to_shape_map()
  assert shapes == sharded.get_variable_to_shape_map()
  for key in shapes:
    if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
      np.testing.assert_array_equal(rep.get_tensor(key),
                                    sharded.get_tensor(key), err_msg=key)


@pytest.mark.slow  # 2 replicas: seconds
def test_two_replicas_sharded_checkpoint_resumes_on_one(two_replicas):
  strategy = tf.distribute.get_strategy()
  t = _trainer(strategy, "adam", True)
  tf.train.Checkpoint(**t.checkpoint_items()).read(
      two_replicas["adam/True"]["path"]).assert_existing_objects_matched()
  np.testing.assert_allclose(t.train(STEPS)[0]["loss"],
                             two_replicas["adam/True"]["on"], rtol=1e-5)


def test_on_one_replica_the_weights_are_updated_in_place():
  """One shard would hold all: the replicated update, at its cost (Adam's
  slots and the EMA), and the sharded run's checkpoint layout (both save
  as replicated: the tests above)."""
  strategy = tf.distribute.get_strategy()
  trainers = {shard: _trainer(strategy, "adam", shard)
              for shard in (False, True)}
  assert isinstance(trainers[True].update, sharding.Replicated)
  sizes = sum(v.shape.num_elements()
              for v in trainers[True].model.trainable_variables)
  for t in trainers.values():  # step; two moments and the average
    assert optimizer_state.per_device(strategy, t.update, t.ema) == 8 + 12 * sizes


def _part_update(optimizer, shard, grad, rows: int, replicas: int):
  """replica -> the update of `shard` by its part of `grad`."""
  def update(replica):
    optimizer.apply([sharding.part_of(grad, rows, replicas, replica)],
                    [shard])
  return update


def test_a_tensor_replica_id_under_xla_updates_as_the_graph_and_the_whole():
  """GPU/TPU by construction, a CPU proxy: each of 4 replicas' part of an
  Adam update, the part chosen by a replica id that is a tensor (a TPU's)
  in an XLA-compiled function, is the graph function's and, laid end to
  end, the update of the whole weight (Keras' own, two steps)."""
  rng = np.random.default_rng(0)
  weight, grad = (rng.normal(size=(5, 3)).astype(np.float32)
                  for _ in range(2))
  n, rows = 4, 4  # ceil(15 / 4): the last part padded
  whole = keras.Variable(weight)
  reference = keras.optimizers.Adam(0.1)
  reference.build([whole])
  for _ in range(2):
    reference.apply([tf.constant(grad)], [whole])
  got = {}
  for jit in (True, False):
    parts = []
    for r in range(n):
      shard = keras.Variable(sharding.part_of(weight, rows, n, r))
      optimizer = keras.optimizers.Adam(0.1)
      optimizer.build([shard])
      step = tf.function(_part_update(optimizer, shard, grad, rows, n),
                         jit_compile=jit)
      for _ in range(2):
        step(tf.constant(r))
      parts.append(shard.numpy())
    got[jit] = np.concatenate(parts)[:weight.size].reshape(weight.shape)
  np.testing.assert_allclose(got[True], got[False], rtol=1e-6)
  np.testing.assert_array_equal(got[False], whole.numpy())


@pytest.mark.parametrize("name", ["Adafactor", "Muon", "Lamb"])
def test_shape_dependent_optimizers_are_refused_in_one_line(name):
  optimizer = getattr(keras.optimizers, name)()
  why = sharding.refusal(tf.distribute.get_strategy(), optimizer)
  assert why.startswith("config.distribution.shard_optimizer=True:")
  assert name in why and "\n" not in why and "shard_optimizer=False" in why
  assert sharding.refusal(tf.distribute.get_strategy(),
                          keras.optimizers.AdamW()) is None


def test_a_tpu_strategy_is_refused_in_one_line():
  tpu = mock.Mock(spec=tf.distribute.TPUStrategy)
  why = sharding.refusal(tpu, keras.optimizers.Adam())
  assert "TPUStrategy" in why and "\n" not in why


def test_the_trainer_refuses_what_cannot_shard():

  class Factored(trainer_lib.Trainer):
    def build_optimizer(self):
      return keras.optimizers.Adafactor()
  config = configured(tiny.get_config(), distribution__shard_optimizer=True)
  with pytest.raises(ConfigError, match="Adafactor"):
    pieces.trainer(config, tf.distribute.get_strategy(), Factored)
