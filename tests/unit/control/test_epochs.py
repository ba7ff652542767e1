"""Epochs as steps (looper.control.epochs): train.epochs and every_epochs
resolved from the train split's size in array, element and bucket mode,
with gradient accumulation, on 1 and 2 replicas; the one-line refusals;
the header.

Every expected number is computed here from the split's size by integer
arithmetic: N epochs of n examples at U examples per update are
ceil(N x n / U) updates (looper rounds up: N epochs show every example N
times).
"""

import fractions
import json

from absl import logging
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import run
from looper.cli import describe
from looper.workdir import jsonl
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.events import curve
from tests.fixtures.processes import run_ok


def _updates(epochs_asked: float, examples: int, per_update: int) -> int:
  """ceil(epochs x examples / per_update), exactly (no float)."""
  e = fractions.Fraction(str(epochs_asked))
  return -(-(e.numerator * examples) // (e.denominator * per_update))


def _in_epochs(**fields):
  """tiny's config counted in epochs: train.steps and the cadence unset."""
  return configured(tiny.get_config(), {
      "train.steps": 0, "eval.every_steps": 0, "checkpoint.every_steps": 0,
      **fields})


def _resolve(config, **kwargs):
  lc.validate(config)
  return lc.resolve_epochs(
      config, pieces.input(config, tf.distribute.get_strategy()), **kwargs)


@pytest.mark.parametrize("as_arrays", [True, False], ids=["array", "element"])
@pytest.mark.parametrize("asked,accum,want", [
    (1.0, 1, 32),    # 1001 / 32 = 31.3 batches: the 32nd ends in epoch 2
    (2.5, 2, 40),    # 2502.5 / 64 = 39.1
    (0.3, 1, 10),    # 300.3 / 32 = 9.4
])
def test_epochs_are_updates_rounded_up(as_arrays, asked, accum, want):
  c = _in_epochs(**{"train.epochs": asked, "train.grad_accum_steps": accum,
                    "eval.every_epochs": 0.5, "data.as_arrays": as_arrays})
  resolved, epoch = _resolve(c)
  n = len(tiny.make_data(c.model.num_examples, seed=0)[1])
  assert n == 1001
  assert resolved.train.steps == want == _updates(asked, n, 32 * accum)
  assert resolved.eval.every_steps == _updates(0.5, n, 32 * accum)
  assert resolved.checkpoint.every_steps == 0  # not asked: off
  assert (epoch.examples, epoch.counted) == (n, not as_arrays)
  # The caller's config stays as asked; the copy keeps the epochs too.
  assert (c.train.steps, resolved.train.epochs) == (0, asked)
  lc.validate(c)


def test_bucket_mode_counts_the_whole_batches_of_each_bucket():
  # Example i: i+1 repeated lengths[i] times; bucket 10, batch 8: each
  # bucket's last partial batch is dropped from every epoch.
  lengths = np.random.default_rng(0).integers(0, 40, 203)

  def dataset_fn(config, split):
    rows = [np.full(n, i + 1, np.int32) for i, n in enumerate(lengths)]
    ragged = tf.RaggedTensor.from_row_lengths(np.concatenate(rows), lengths)
    return tf.data.Dataset.from_tensor_slices(
        (ragged, np.arange(len(lengths), dtype=np.int32))).map(
            lambda x, y: (x, y))

  c = configured(lc.default_config(), {
      "train.epochs": 3.0, "train.batch_size": 8, "train.grad_accum_steps": 2,
      "checkpoint.every_epochs": 1.0, "data.bucket": 10})
  c.model_fn, c.dataset_fn = tiny.model_fn, dataset_fn
  per_epoch = int(np.sum(np.bincount(np.maximum(-(-lengths // 10), 1)) // 8))
  resolved, epoch = _resolve(c)
  assert (epoch.examples, epoch.batches) == (203, per_epoch)
  assert resolved.train.steps == -(-3 * per_epoch // 2)
  assert resolved.checkpoint.every_steps == -(-per_epoch // 2)


def test_steps_and_epochs_both_set_are_refused_in_one_line():
  for field, value, message in [
      ("train.epochs", 2, "config.train.steps=40 and config.train.epochs=2.0"
       " both set how long to train; set one of them to 0:"
       " --config.train.steps=0 to count in epochs, or"
       " --config.train.epochs=0"),
      ("eval.every_epochs", 1, "config.eval.every_steps=20 and"
       " config.eval.every_epochs=1.0 both set when to evaluate; set one of"
       " them to 0: --config.eval.every_steps=0 to count in epochs, or"
       " --config.eval.every_epochs=0"),
      ("checkpoint.every_epochs", 0.5, "config.checkpoint.every_steps=20 and"
       " config.checkpoint.every_epochs=0.5 both set when to save; set one of"
       " them to 0: --config.checkpoint.every_steps=0 to count in epochs, or"
       " --config.checkpoint.every_epochs=0"),
      ("train.steps", 0, "config.train.steps=0 and config.train.epochs=0.0:"
       " nothing sets how long to train; set --config.train.steps (optimizer"
       " updates) or --config.train.epochs")]:
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(configured(tiny.get_config(), {field: value}))
    assert str(e.value) == message


def test_warmup_and_profile_are_bounded_by_the_resolved_steps():
  # 0.2 x 1001 / 32 = 6.3: 7 steps.
  for field, value, message in [
      ("optimizer.warmup_steps", 8, "config.optimizer.warmup_steps=8: must"
       " be <= train.steps=7"),
      ("profile.start_step", 7, "config.profile.start_step=7: must be <"
       " train.steps=7: the trace holds the steps after it; set"
       " --config.profile.start_step")]:
    with pytest.raises(lc.ConfigError) as e:
      _resolve(_in_epochs(**{"train.epochs": 0.2, field: value}))
    assert str(e.value) == message


def test_a_trainer_needs_the_resolved_steps():
  c = _in_epochs(**{"train.epochs": 2.0})
  with pytest.raises(lc.ConfigError) as e:
    pieces.trainer(c, tf.distribute.get_strategy())
  assert str(e.value) == (
      "config.train.steps=0 reached the Trainer with train.epochs=2.0; build"
      " it from the config looper.config.resolve_epochs(config, input)[0]"
      " returns (as looper.run does), or set config.train.steps")
  resolved, _ = _resolve(c)
  assert pieces.trainer(resolved, tf.distribute.get_strategy())


def test_the_header_says_what_the_steps_are_in_epochs():
  # Array mode knows its size: the steps set as steps are shown in epochs.
  arrays = configured(tiny.get_config(), {"data.as_arrays": True})
  text = describe.describe(arrays)
  assert 40 * 32 / 1001 == pytest.approx(1.279, abs=5e-4)
  assert ("  steps      40 = 1.279 epochs of 1,001, 10 per loop; eval every"
          " 20, checkpoint every 20\n") in text
  # Element mode counts its split (describe counts its splits anyway).
  text = describe.describe(_in_epochs(**{"train.epochs": 1.0}))
  assert 32 * 32 / 1001 == pytest.approx(1.023, abs=5e-4)
  assert ("  steps      32 = 1.023 epochs of 1,001 (counted by one pass), 10"
          " per loop; eval every end, checkpoint every end\n") in text
  # The resolved config: the epochs asked for, the steps they came to.
  resolved = json.loads(text[text.index("\nconfig\n") + 8:])["train"]
  assert (resolved["epochs"], resolved["steps"]) == (1.0, 32)


# 200 examples, 64 per update (2 micro-batches of 32): 3.125 updates an
# epoch. 2 epochs: 7 steps; eval every epoch: every 4; save every half: 2.
RUN = {"model.num_examples": 200, "train.epochs": 2.0,
       "train.grad_accum_steps": 2, "eval.every_epochs": 1.0,
       "checkpoint.every_epochs": 0.5, "checkpoint.keep": 10,
       "optimizer.schedule": "linear"}
# 7 x 64 / 200 = 2.24 epochs: the last update reaches into the third.
HEADER = ("  steps      7 = 2.24 epochs of 200 (counted by one pass), 10 per"
          " loop; eval every 4, checkpoint every 2")


def _check_run(workdir):
  """The run of RUN in `workdir` stopped, evaluated and saved where the
  epochs say, its schedule over the resolved steps."""
  steps = _updates(2.0, 200, 64)
  assert (steps, _updates(1.0, 200, 64), _updates(0.5, 200, 64)) == (7, 4, 2)
  lines = jsonl.read(str(workdir / "metrics.jsonl"))
  assert [l["step"] for l in lines if l["kind"] == "eval"] == [4, 7]
  train = [l for l in lines if l["kind"] == "train"]
  assert train[-1]["step"] == steps
  assert train[-1]["learning_rate"] == 0.0  # linear: 0 at train.steps
  saved = tf.train.get_checkpoint_state(str(workdir / "checkpoints"))
  assert [int(p.rsplit("-", 1)[1]) for p in
          saved.all_model_checkpoint_paths] == [2, 4, 6, 7]
  config = json.loads((workdir / "config.json").read_text())
  assert (config["train"]["epochs"], config["train"]["steps"]) == (2.0, 7)
  assert (config["eval"]["every_epochs"], config["eval"]["every_steps"]) == (
      1.0, 4)
  return curve(workdir / "train")


@pytest.fixture(scope="module")
def one_replica(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("epochs1")
  with pytest.MonkeyPatch.context() as patch:
    logged = []
    patch.setattr(logging, "info",
                  lambda fmt, *args: logged.append(fmt % args))
    result = run.run(_in_epochs(**RUN), str(workdir))
  assert result["step"] == 7
  return workdir, logged


def test_a_run_in_epochs_evaluates_and_saves_at_epoch_steps(one_replica):
  workdir, logged = one_replica
  _check_run(workdir)
  header = next(l for l in logged if l.startswith("looper train_and_eval:"))
  assert HEADER in header.splitlines(), header


@pytest.mark.slow  # its own process: two logical CPU devices
def test_two_replicas_resolve_the_same_steps(one_replica, tmp_path):
  args = [f"--config.{k}={v}" for k, v in {**RUN, "train.steps": 0,
                                           "eval.every_steps": 0,
                                           "checkpoint.every_steps": 0}.items()]
  proc = run_ok("--config=tests/fixtures/tiny.py", f"--workdir={tmp_path}",
                *args,
                "--config.distribution.num_cpu_devices=2")
  header = proc.stderr.splitlines()
  assert "  strategy   Mirrored, 2 replicas (2 CPU)" in header, header[:6]
  assert HEADER in header, header[:6]
  np.testing.assert_allclose(_check_run(tmp_path),
                             curve(one_replica[0] / "train"), rtol=1e-5)
