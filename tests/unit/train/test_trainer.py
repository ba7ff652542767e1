"""Subclassing the Trainer, and loops clamped to eval/checkpoint steps."""

import functools
import re

import numpy as np
import pytest
import tensorflow as tf

from looper import errors
from looper import run
from looper.train import trainer as trainer_lib
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.events import curve, scalars


class RecordingTrainer(trainer_lib.Trainer):
  """Changes one thing: records the host-side loop ends."""
  loop_ends = []

  def on_loop_end(self, step, logs):
    RecordingTrainer.loop_ends.append((step, sorted(logs)))


class DoubleLossTrainer(trainer_lib.Trainer):
  """Changes one thing: the per-example loss."""

  def compute_loss(self, labels, logits):
    return 2.0 * super().compute_loss(labels, logits)


def test_loops_end_exactly_on_eval_checkpoint_and_last_step(tmp_path):
  c = tiny.get_config()
  c.trainer = RecordingTrainer
  c.train.steps, c.train.steps_per_loop = 40, 7
  c.eval.every_steps, c.checkpoint.every_steps = 20, 15
  c.train.grad_norm = True
  RecordingTrainer.loop_ends.clear()
  run.run(c, str(tmp_path))
  steps = [s for s, _ in RecordingTrainer.loop_ends]
  assert steps == [7, 14, 15, 20, 27, 30, 37, 40]
  assert RecordingTrainer.loop_ends[0][1] == [
      "accuracy", "examples_per_sec", "flops_per_sec", "grad_norm",
      "grad_norm_max", "input_wait_fraction", "learning_rate", "loss", "mfu",
      "steps_per_sec", "update_ratio", "weight_norm"]
  assert sorted(scalars(tmp_path / "eval", "loss")) == [20, 40]
  assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.index")) == [
      "ckpt-15.index", "ckpt-30.index", "ckpt-40.index"]
  assert len(curve(tmp_path / "train")) == 40


def test_compute_loss_override_changes_only_the_loss(tmp_path):
  losses = {}
  for cls in (trainer_lib.Trainer, DoubleLossTrainer):
    c = tiny.get_config()
    c.trainer = cls
    c.model.l2 = 0.0
    c.train.steps = c.train.steps_per_loop = 1
    run.run(c, str(tmp_path / cls.__name__), mode="train")
    losses[cls] = curve(tmp_path / cls.__name__ / "train")[0]
  # Step 1 runs on the same initial weights and batch.
  assert losses[DoubleLossTrainer] == pytest.approx(
      2 * losses[trainer_lib.Trainer], rel=1e-6)


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_nan_loss_stops_before_saving_over_a_good_checkpoint(tmp_path):
  c = tiny.get_config()
  c.train.steps, c.checkpoint.every_steps = 20, 10
  run.run(c, str(tmp_path))  # a good run: ckpt-10, ckpt-20
  c.train.steps = 40
  c.optimizer.learning_rate = 1e30  # resumed, it diverges within a loop
  with pytest.raises(FloatingPointError) as e:
    run.run(c, str(tmp_path))
  message = str(e.value)
  ckpt_dir = tmp_path / "checkpoints"
  assert re.fullmatch(
      rf"train loss is (nan|inf|-inf) at step 2\d; {ckpt_dir}/ckpt-20 is"
      r" kept; lower --config.optimizer.learning_rate or check the data, or"
      r" set --config.train.nan_recovery_tries=1 to roll back to it and skip"
      r" this loop's data",
      message), message
  assert tf.train.latest_checkpoint(str(ckpt_dir)).endswith("ckpt-20")
  assert sorted(p.name for p in ckpt_dir.glob("*.index")) == [
      "ckpt-10.index", "ckpt-20.index"]
  reader = tf.train.load_checkpoint(str(ckpt_dir / "ckpt-20"))
  floats = [k for k, dtype in reader.get_variable_to_dtype_map().items()
            if dtype.is_floating]
  assert len(floats) >= 4  # kernels, biases, optimizer slots
  for key in floats:
    assert np.isfinite(reader.get_tensor(key)).all(), key


def test_resume_takes_the_new_learning_rate_from_the_config(tmp_path):
  c = tiny.get_config()
  c.train.steps = 20
  run.run(c, str(tmp_path), mode="train")
  c.train.steps, c.optimizer.learning_rate = 30, 0.5
  result = run.run(c, str(tmp_path), mode="train")
  assert result["train"]["learning_rate"] == pytest.approx(0.5)
  assert scalars(tmp_path / "train", "learning_rate") == pytest.approx(
      {10: 0.1, 20: 0.1, 30: 0.5})


class WholeBatchTrainer(trainer_lib.Trainer):
  """Changes one thing: `train_step` takes its update's whole batch at
  once, with no micro-batches (and counts its calls)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = tf.Variable(0, trainable=False)
    self.rows = []  # the batch's rows, each time the step is traced

  def train_step(self, batch):
    inputs, labels = batch
    self.rows.append(labels.shape[0])
    self.calls.assign_add(1)
    loss, grads, logits = self.compute_gradients(inputs, labels)
    self.update_metrics(self.train_metrics, labels, logits)
    self.apply_gradients(self.transform_gradients(grads))
    return loss


def test_an_overridden_train_step_is_called_under_accumulation():
  def trainer(cls):
    c = tiny.get_config()
    c.train.batch_size, c.train.grad_accum_steps = 16, 2
    c.model.l2 = 0.0  # compute_gradients splits a regularizer per micro-batch
    return pieces.trainer(c, cls=cls)

  default, whole = trainer(trainer_lib.Trainer), trainer(WholeBatchTrainer)
  want = default.train(6)[0]["loss"]
  got = whole.train(6)[0]["loss"]
  # Called once per update, with both micro-batches (32 rows): one step
  # over the larger batch is the update accumulation makes.
  assert int(whole.calls.numpy()) == 6 and set(whole.rows) == {32}
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for a, b in zip(whole.model.weights, default.model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
  assert whole.input.data_position == default.input.data_position == 6 * 32


def _unflip(values):
  """A helper of the user's: AutoGraph converts it with its caller."""
  if tf.reduce_sum(values) < 0:  # never true; a graph-time tensor `if`
    values = -values
  return values


class BranchingTrainer(trainer_lib.Trainer):
  """Branches on tensors in its overrides, as AutoGraph allows in any
  tf.function: looper's traced code is not converted, a subclass's is."""

  def compute_loss(self, labels, logits):
    values = super().compute_loss(labels, logits)
    if tf.reduce_sum(values) < 0:
      values = -values
    return values

  def eval_step(self, batch):
    if tf.shape(batch[-1])[0] > 0:  # always: the mask of a batch
      super().eval_step(batch)


class DeeperTrainer(BranchingTrainer):

  def train_step(self, batch):
    return _unflip(super().train_step(batch))


class BranchingMixin:
  """An override a Trainer subclass inherits rather than defines."""

  def compute_loss(self, labels, logits):
    values = super().compute_loss(labels, logits)
    if tf.reduce_sum(values) < 0:
      values = -values
    return values


class MixedTrainer(BranchingMixin, trainer_lib.Trainer):
  pass


def branching_loss(labels, logits):
  return _unflip(tf.keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True))


def scaled_loss(labels, logits, scale):
  return scale * branching_loss(labels, logits)


class BranchingLoss:
  """A loss as a callable object, and as a bound method."""

  def __call__(self, labels, logits):
    return branching_loss(labels, logits)

  def method(self, labels, logits):
    return branching_loss(labels, logits)


@pytest.fixture
def conversions(monkeypatch):
  """The functions AutoGraph converts (by qualified name)."""
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  seen, convert = [], api._convert_actual  # pylint: disable=protected-access

  def recording(entity, program_ctx):
    seen.append(entity.__qualname__)
    return convert(entity, program_ctx)
  monkeypatch.setattr(api, "_convert_actual", recording)
  return seen


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_autograph_converts_the_users_code_only(conversions):
  c = tiny.get_config()
  strategy = tf.distribute.get_strategy()
  base = pieces.trainer(c, strategy)
  want = base.train(3)[0]["loss"]
  want_eval = pieces.evaluator(base).evaluate()
  assert not conversions  # looper's loops, seams and helpers: plain
  subclass = pieces.trainer(c, strategy, cls=DeeperTrainer)
  got = subclass.train(3)[0]["loss"]
  np.testing.assert_array_equal(got, want)
  assert pieces.evaluator(subclass).evaluate() == want_eval
  assert sorted(set(conversions)) == [
      "BranchingTrainer.compute_loss", "BranchingTrainer.eval_step",
      "DeeperTrainer.train_step", "_unflip"]
  conversions.clear()
  got = pieces.trainer(c, strategy, cls=MixedTrainer).train(3)[0]["loss"]
  np.testing.assert_array_equal(got, want)
  assert sorted(set(conversions)) == ["BranchingMixin.compute_loss"]
  for loss, names in ((branching_loss, ["_unflip", "branching_loss"]),
                      (functools.partial(scaled_loss, scale=1.0),
                       ["_unflip", "branching_loss", "scaled_loss"]),
                      (BranchingLoss(), ["BranchingLoss.__call__", "_unflip",
                                         "branching_loss"]),
                      (BranchingLoss().method, ["BranchingLoss.method",
                                                "_unflip", "branching_loss"])):
    conversions.clear()
    c.loss = loss
    got = pieces.trainer(c, strategy).train(3)[0]["loss"]
    np.testing.assert_array_equal(got, want)
    assert sorted(set(conversions)) == names


class NoLossTrainer(trainer_lib.Trainer):
  """Returns per-step values without the loss."""

  def train_step(self, batch):
    return {"d_loss": super().train_step(batch)}


class VectorTrainer(trainer_lib.Trainer):
  """Returns a per-step value that is not a scalar."""

  def train_step(self, batch):
    return {"loss": super().train_step(batch), "labels": batch[1]}


@pytest.mark.parametrize("cls, message", [
    (NoLossTrainer, "config.trainer=NoLossTrainer: train_step returned"
     " ['d_loss'] without 'loss'; return its share of the global mean loss"
     " under 'loss' beside them"),
    (VectorTrainer, "config.trainer=VectorTrainer: train_step returned"
     " 'labels' of rank 1; each per-step value is a scalar under a name"
     " (this replica's share: summed over the replicas)")])
def test_a_train_step_s_values_are_refused_in_one_line(cls, message):
  trainer = pieces.trainer(tiny.get_config(), cls=cls)
  with pytest.raises(errors.ConfigError) as e:
    trainer.train(2)
  assert str(e.value) == message
