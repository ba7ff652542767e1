"""Faults a real run meets: kill -9, SIGTERM, NaN data, an evaluator beside.

Each test runs looper for real (a process where signals or a strategy are
involved) and compares against an uninterrupted run or a hand-computed
expectation.
"""

import json
import logging
import random
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import run
from looper.workdir import contents
from tests.fixtures import catalogue
from tests.fixtures import tiny
from tests.fixtures.events import curve, scalars
from tests.fixtures.configs import run_here
from tests.fixtures.processes import popen_looper, wait_for
from tests.fixtures.stopping import stop_and_resume
from tests.stress import kill9

TINY = "--config=tests/fixtures/tiny.py"


def model_tensors(prefix) -> dict[str, np.ndarray]:
  """The model's weights in a checkpoint, by their place in the model."""
  reader = tf.train.load_checkpoint(str(prefix))
  keys = contents.variable_keys(str(prefix), "model")
  assert len(keys) == 4, keys  # tiny's two kernels and two biases
  return {name: reader.get_tensor(key) for name, key in keys.items()}


def assert_same_tensors(want, got):
  assert sorted(want) == sorted(got)
  for key in want:
    np.testing.assert_array_equal(want[key], got[key], err_msg=key)


@pytest.mark.slow  # a subprocess
def test_kill9_at_random_moments_resumes_bit_exact(tmp_path):
  """One run killed while saving, its rerun killed after an eval step
  (resuming what the kill before left), then run to its end: bit-exact.
  Saving first: a kill there leaves a checkpoint's temporary files behind,
  which the later kind does not look for. 40 steps: a save at 10, an eval
  at 20 to kill at. The uninterrupted reference and the last rerun (it
  reads the disk alone) run here, on the session's 2 logical CPUs. A kill
  in a loop is the LM's and goodput's kill -9 (test_lm.py, test_goodput.py);
  `python -m tests.stress.kill9` runs many trials of each kind, 120 steps."""
  steps = 40
  to_end = lambda workdir: run_here(*kill9.ARGS, f"--workdir={workdir}",
                                    f"--config.train.steps={steps}")
  to_end(tmp_path / "reference")
  rng = random.Random(1)
  kills = [kill9.run_and_kill(tmp_path / "run", kind, rng, steps)
           for kind in ("save", "eval")]
  assert "exited before the kill" not in kills, kills
  to_end(tmp_path / "run")
  assert kill9.compare(tmp_path / "reference", tmp_path / "run",
                       steps) == "", kills


@pytest.mark.slow  # a subprocess
def test_sigterm_stops_mid_loop_saves_and_resumes_exactly(tmp_path,
                                                          unstopped):
  stop_and_resume(tmp_path, unstopped,
                  lambda proc: proc.send_signal(signal.SIGTERM), "SIGTERM")


@pytest.mark.slow  # a subprocess
def test_continuous_eval_beside_training_evaluates_each_checkpoint_once(
    tmp_path):
  """The evaluator in its own process, waiting (its header printed) before
  the training, in this process, writes its first checkpoint."""
  wd = tmp_path / "run"
  evaluator = popen_looper(
      TINY, f"--workdir={wd}", "--mode=continuous_eval",
      "--config.train.steps=60", "--config.eval.batch_size=32",
      "--config.eval.timeout_secs=120", log=tmp_path / "evaluator.log")
  try:
    wait_for(evaluator.log, "looper continuous_eval: ")
    run_here(TINY, f"--workdir={wd}", "--mode=train",
             "--config.train.steps=60", "--config.train.steps_per_loop=5",
             "--config.checkpoint.every_steps=10",
             "--config.checkpoint.keep=10")
    evaluator.wait(timeout=300)
  finally:
    evaluator.kill()
    evaluator.wait()
  assert evaluator.returncode == 0, evaluator.log.read_text()[-2000:]
  steps = [10, 20, 30, 40, 50, 60]
  assert scalars(wd / "eval_continuous", "examples") == {
      s: 1001 for s in steps}
  assert sorted(scalars(wd / "eval_continuous", "accuracy")) == steps
  assert not (wd / "eval").exists()  # train mode: no evaluation
  # The evaluator's own override never reaches the trainer's record.
  saved = json.loads((wd / "config.json").read_text())
  assert saved["eval"]["batch_size"] == 64


def nan_to_0_relu(z):
  """ReLU with max(NaN, 0) = 0 on every CPU: a comparison with NaN is false
  (IEEE 754), and the select's gradient there is 0, not NaN. tf.nn.relu(NaN)
  is 0 on an Intel Xeon with AMX but NaN on an AMD EPYC."""
  return tf.where(z > 0, z, tf.zeros_like(z))


def nan_model_fn(config):
  """tiny's MLP (its L2 penalty too), its hidden ReLU nan_to_0_relu."""
  model = tiny.model_fn(config)
  hidden = model.layers[0]
  assert hidden.activation is keras.activations.relu, hidden.activation
  hidden.activation = nan_to_0_relu
  return model


def nan_dataset_fn(config, split):
  """tiny's data with a NaN in train example 579 (inside step 19).

  Under nan_model_fn, on any CPU: the ReLU turns the NaN pre-activation
  into 0, so step 19's loss is finite; its gradient is not (the hidden
  kernel's is the NaN input times 0), and from step 20 on the L2 penalty
  of the NaN kernel makes the loss NaN.
  """
  name, selected = tiny.lc.split_slice(split, config.model.num_examples)
  x, y = tiny.make_data(config.model.num_examples,
                        seed={"train": 0, "test": 1}[name])
  if name == "train":
    x[579, 3] = np.nan
  return tf.data.Dataset.from_tensor_slices((x[selected], y[selected]))


def nan_config(steps=25, tries=0):
  c = tiny.get_config()
  c.model_fn, c.dataset_fn = nan_model_fn, nan_dataset_fn
  c.data.shuffle_buffer = 0  # global example i is example i: no shuffle
  c.train.steps, c.train.steps_per_loop = steps, 5
  c.checkpoint.every_steps, c.eval.every_steps = 10, 0
  c.train.nan_recovery_tries = tries
  return c


def test_nan_in_the_data_stops_before_saving(tmp_path):
  with pytest.raises(FloatingPointError, match=catalogue.line(
      "nan-loss", value="nan", step=20,
      checkpoint=tmp_path / "checkpoints" / "ckpt-10")):
    run.run(nan_config(), str(tmp_path), mode="train")
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith(
      "ckpt-10")


def test_nan_weights_after_a_finite_loss_are_never_saved(tmp_path):
  # Step 19's loss is finite but its update is not; a save is due at 19.
  c = nan_config()
  c.checkpoint.every_steps = 19
  with pytest.raises(FloatingPointError) as e:
    run.run(c, str(tmp_path), mode="train")
  assert str(e.value) == (
      "the weights are not finite after step 19; no checkpoint was written;"
      " lower --config.optimizer.learning_rate or check the data")
  assert not list((tmp_path / "checkpoints").glob("*.index"))


def test_nan_recovery_skips_the_window_that_blew_up(tmp_path, caplog):
  result = run.run(nan_config(tries=1), str(tmp_path), mode="train")
  # Loop 16..20 blew up at step 20: back to ckpt-10, the data position
  # moved past that loop (20 * 32), then steps 11..25 trained on. Loop
  # 11..15 was reported before the blow-up and is replayed: its events
  # are replaced, not doubled.
  assert result["step"] == 25
  reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints" / "ckpt-25"))
  assert reader.get_tensor("position/.ATTRIBUTES/VARIABLE_VALUE") == (
      20 * 32 + 15 * 32)
  assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 25
  warnings = [r.getMessage() for r in caplog.records
              if "restored" in r.getMessage()]
  assert warnings == [
      f"train loss is nan at step 20; restored {tmp_path}/checkpoints/ckpt-10"
      " (step 10) and skipped the data up to global example 640 (recovery 1"
      " of train.nan_recovery_tries=1)"]
  losses = curve(tmp_path / "train")  # steps 1..25, each once
  assert np.isfinite(losses).all()


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_warm_start_restores_the_model_and_reports(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  source = tiny.get_config()
  source.train.steps = 20
  run.run(source, str(tmp_path / "a"), mode="train")

  c = tiny.get_config()
  c.init.checkpoint = str(tmp_path / "a" / "checkpoints")
  c.train.steps = c.train.steps_per_loop = 1
  # So small an update cannot move a float32 weight: after one step the
  # model still holds exactly the warm-start weights.
  c.optimizer.learning_rate = 1e-30
  run.run(c, str(tmp_path / "b"), mode="train")
  assert_same_tensors(model_tensors(tmp_path / "a/checkpoints/ckpt-20"),
                      model_tensors(tmp_path / "b/checkpoints/ckpt-1"))
  reader = tf.train.load_checkpoint(str(tmp_path / "b/checkpoints/ckpt-1"))
  assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 1
  assert reader.get_tensor("position/.ATTRIBUTES/VARIABLE_VALUE") == 32
  reports = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("Warm start")]
  assert reports == [f"Warm start from {tmp_path}/a/checkpoints/ckpt-20:"
                     " model: 4 of 4 variables restored"]

  # With init.optimizer the slots come too; the schedule starts at 0.
  c.init.optimizer = True
  result = run.run(c, str(tmp_path / "c"), mode="train")
  reports = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("Warm start")]
  # SGD with momentum: the iteration count and one slot per weight (the
  # weights it also tracks are the model's, counted there).
  assert reports[-1] == (f"Warm start from {tmp_path}/a/checkpoints/ckpt-20:"
                         " model: 4 of 4 variables restored; optimizer: 5 of"
                         " 5 variables restored")
  assert result["train"]["learning_rate"] == pytest.approx(1e-30, rel=1e-6, abs=0)
  reader = tf.train.load_checkpoint(str(tmp_path / "c/checkpoints/ckpt-1"))
  assert reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 1


def test_warm_start_errors_name_the_variable_or_the_path(tmp_path):
  source = tiny.get_config()
  source.train.steps = 10
  run.run(source, str(tmp_path / "a"), mode="train")
  c = tiny.get_config()
  c.model.width = 32
  c.init.checkpoint = str(tmp_path / "a" / "checkpoints" / "ckpt-10")
  with pytest.raises(ValueError, match=catalogue.line(
      "init-checkpoint-other-shape", path=repr(c.init.checkpoint),
      variable="_functional/_operations/1/_kernel")):
    run.run(c, str(tmp_path / "b"), mode="train")
  assert not (tmp_path / "b" / "checkpoints").exists()
  c = tiny.get_config()
  c.init.checkpoint = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match=catalogue.line(
      "init-checkpoint-missing", path=tmp_path / "nowhere")):
    run.run(c, str(tmp_path / "c"), mode="train")


def eval_config(steps=60, **checkpoint):
  c = tiny.get_config()
  c.train.steps, c.train.steps_per_loop = steps, 5
  c.eval.every_steps, c.checkpoint.every_steps = 10, 10
  c.checkpoint.keep = 10
  for key, value in checkpoint.items():
    c.checkpoint[key] = value
  return c


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_best_checkpoint_is_the_best_evaluation(tmp_path):
  c = eval_config(best_metric="loss", best_mode="min")
  c.optimizer.learning_rate = 2.0  # noisy on purpose: the best is not last
  run.run(c, str(tmp_path))
  losses = scalars(tmp_path / "eval", "loss")
  best = min(losses, key=lambda s: (losses[s], s))
  assert sorted(p.name for p in (tmp_path / "checkpoints" / "best").glob(
      "*.index")) == [f"ckpt-{best}.index"]
  assert_same_tensors(model_tensors(tmp_path / f"checkpoints/ckpt-{best}"),
                      model_tensors(tmp_path / f"checkpoints/best/ckpt-{best}"))
  history_file = tmp_path / "checkpoints" / "best" / "history.json"
  history = json.loads(history_file.read_text())
  assert [s for s, _ in history["history"]] == sorted(losses)
  np.testing.assert_allclose([v for _, v in history["history"]],
                             [losses[s] for s in sorted(losses)], rtol=1e-6)
  # Evaluating a checkpoint again is not training: the record stays.
  before = history_file.read_bytes()
  run.run(c, str(tmp_path), mode="eval",
          checkpoint_path=str(tmp_path / "checkpoints" / "ckpt-10"))
  assert history_file.read_bytes() == before


def expected_early_stop(values: dict[int, float], patience: int, better):
  """The step a patience rule stops at, computed from eval values."""
  best, stale = None, 0
  for step in sorted(values):
    if best is None or better(values[step], best):
      best, stale = values[step], 0
    else:
      stale += 1
      if stale >= patience:
        return step
  return None


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_early_stop_after_patience_evaluations(tmp_path):
  # 'max' of a falling loss: every evaluation after the first is "worse".
  run.run(eval_config(), str(tmp_path / "reference"))
  losses = scalars(tmp_path / "reference" / "eval", "loss")
  want = expected_early_stop(losses, 2, lambda a, b: a > b)
  assert want == 30, losses  # evaluations at 10 (best), 20, 30

  c = eval_config(best_metric="loss", best_mode="max")
  c.train.early_stop_patience = 2
  result = run.run(c, str(tmp_path / "run"))
  assert result["step"] == want and "early stop at step 30" in result["ended"]
  assert tf.train.latest_checkpoint(
      str(tmp_path / "run" / "checkpoints")).endswith(f"ckpt-{want}")
  assert sorted(scalars(tmp_path / "run" / "eval", "loss")) == [10, 20, 30]
  # Rerun with the same command: patience is still spent, nothing trains.
  again = run.run(c, str(tmp_path / "run"))
  assert again["step"] == want and "early stop" in again["ended"]
