"""Subclassing the Trainer, and loops clamped to eval/checkpoint steps."""

import numpy as np
import pytest
import tensorflow as tf

from looper import run
from looper import trainer as trainer_lib
from tests import tiny
from tests.conftest import curve, scalars


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
  RecordingTrainer.loop_ends.clear()
  run.run(c, str(tmp_path))
  steps = [s for s, _ in RecordingTrainer.loop_ends]
  assert steps == [7, 14, 15, 20, 27, 30, 37, 40]
  assert RecordingTrainer.loop_ends[0][1] == [
      "accuracy", "examples_per_sec", "learning_rate", "loss", "steps_per_sec"]
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


def test_nan_loss_stops_before_saving_over_a_good_checkpoint(tmp_path):
  c = tiny.get_config()
  c.train.steps, c.checkpoint.every_steps = 40, 10
  c.optimizer.learning_rate = 1e30  # diverges after a few steps
  with pytest.raises(FloatingPointError) as e:
    run.run(c, str(tmp_path))
  message = str(e.value)
  assert "\n" not in message and "--config.optimizer.learning_rate" in message
  saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.index"))
  assert f"{tmp_path}/checkpoints/{saved[-1][:-6]} is kept" in message if (
      saved) else "no checkpoint was written" in message
  for name in saved:  # whatever was saved holds finite weights
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints" /
                                          name[:-6]))
    for key in reader.get_variable_to_shape_map():
      value = reader.get_tensor(key)
      if np.issubdtype(np.asarray(value).dtype, np.floating):
        assert np.isfinite(value).all(), key
