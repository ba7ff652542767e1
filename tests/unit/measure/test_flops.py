"""FLOPs and MFU: a train step's count against hand counts, and a run's
speed in its progress line, metrics.jsonl and TensorBoard, which agree
with each other and with the count x steps / the loop's seconds / the
peak (the peak itself: test_peak_flops).

The counts are exact: the LM's is PaLM's accounting (6 x the matmul
weights per token, forward and backward, plus 12 x layers x context x
width for the attention), the CNN's and the LSTM's hand counts of their
multiply-adds. Against 6 x ALL the LM's parameters the count is lower by
6 x the parameters no matmul uses (the position embedding, LayerNorms and
biases: 4.3% of this small model, 1.8% of the default one). About 25 s
on 2 busy cores.
"""

import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from experiments import lm
from experiments import mnist
from looper import run
from looper import workdir as workdir_lib
from looper.options import distribute
from looper.measure import flops
from looper.measure import peak_flops
from looper.workdir import jsonl
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.events import scalars
from tests.unit.control import test_controller

# The small LM: V bytes, L blocks of width W, context T, batch B.
V, L, W, T, B = 256, 2, 32, 16, 4
LM = {"model.layers": L, "model.heads": 2, "model.width": W,
      "model.context": T, "train.batch_size": B, "train.steps_per_loop": 2,
      "optimizer.warmup_steps": 0}


def _corpus(tmp_path):
  """A folder of text: train.txt, and faq/ for eval (lm's default glob)."""
  text = b"The quick brown fox jumps over the lazy dog, twice. " * 40
  (tmp_path / "faq").mkdir(parents=True)
  (tmp_path / "train.txt").write_bytes(text)
  (tmp_path / "faq" / "q.txt").write_bytes(text[:300])
  return tmp_path


def _step_flops(config) -> float:
  """FLOPs of one step, as the train loop counted them (its logs' flops
  are the steps run times the count)."""
  trainer = pieces.trainer(config, distribute.strategy_for(config.distribution))
  _, logs = trainer.train(2)
  return logs["flops"] / 2


def lm_flops(tokens: int) -> int:
  """PaLM's: 6 x the matmul weights (every block's 12 W^2, the tied
  embedding as output projection) + 12 L T W of attention, per token."""
  return tokens * (6 * (12 * L * W * W + V * W) + 12 * L * T * W)


def cnn_flops(width: int, batch: int) -> int:
  """The guide CNN's multiply-adds x 2: forward, then the gradients of
  every weight and of every layer's input but the images' (nothing reads
  that one: TensorFlow prunes it)."""
  conv1 = 26 * 26 * width * 3 * 3 * 1  # 28x28x1 -> 26x26xw, 3x3 'valid'
  conv2 = 24 * 24 * width * 3 * 3 * width  # -> 24x24xw
  dense = 24 * 24 * width * width + width * (width // 2) + (width // 2) * 10
  forward = conv1 + conv2 + dense
  return 2 * batch * (3 * forward - conv1)


def test_an_update_of_two_micro_batches_counts_both():
  c = configured(mnist.get_config("bundled"), {
      "model.width": 8, "train.batch_size": 8, "train.steps_per_loop": 2,
      "train.grad_accum_steps": 2})
  assert _step_flops(c) == 2 * cnn_flops(8, 8)


def test_lstm_loop_counts_each_time_step():
  """Keras' LSTM is a while loop over time (and one for its gradient):
  counted times its static trip count, T time steps."""
  embed, units, steps = 6, 5, tiny.FEATURES
  c = tiny.get_config()
  c.model.embed = embed
  c.model_fn = lambda config: keras.Sequential([
      keras.Input((steps,), dtype="int32"),
      keras.layers.Embedding(tiny.FEATURES * tiny.BINS, embed),
      keras.layers.LSTM(units), keras.layers.Dense(tiny.NUM_CLASSES)])
  c.train.steps_per_loop = 2
  per_step = 4 * units * (embed + units)  # 4 gates of [x, h] @ kernels
  forward = steps * per_step + units * tiny.NUM_CLASSES
  assert _step_flops(c) == 2 * c.train.batch_size * 3 * forward


def test_a_shape_unknown_when_traced_is_not_counted():
  """data.bucket's inputs have no static length: no count, no MFU."""
  step = tf.function(lambda x: tf.matmul(x, tf.ones([3, 2])))
  default = tf.distribute.get_strategy()
  static = step.get_concrete_function(tf.TensorSpec([4, 3]))
  assert flops.per_step(static, default) == 2 * 4 * 3 * 2
  unknown = step.get_concrete_function(tf.TensorSpec([None, 3]))
  assert flops.per_step(unknown, default) is None


def test_tokens_are_the_real_ones_when_weighted():
  ids = tf.zeros([2, 5], tf.int32)
  weights = tf.constant([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  assert float(flops.tokens((ids, ids, weights))) == 8
  assert float(flops.tokens((ids, ids))) == 10
  assert float(flops.tokens((ids, ids[:, 0], weights[:, 0]))) == 10
  spec = tf.TensorSpec([5], tf.int32)
  assert flops.is_sequence((spec, spec))
  assert not flops.is_sequence((tf.TensorSpec([5], tf.float32), spec))


class WorkingTrainer(test_controller.FakeTrainer):
  """Each step: 3e9 FLOPs and 100 tokens; half a second of the clock."""

  def train(self, steps):
    losses, logs = super().train(steps)
    return losses, {**logs, "flops": 3e9 * steps, "tokens": 100.0 * steps}


def test_the_controller_turns_work_into_rates_over_the_loops_time(caplog):
  clock = test_controller.Clock()
  trainer = WorkingTrainer(clock=clock, secs_per_step=0.5)
  given = peak_flops.Peak(4e9, "train.peak_flops=4e+09")
  ctl, _, _ = test_controller.make(total=8, steps_per_loop=4, trainer=trainer,
                                   peak=given, clock=clock)
  with caplog.at_level(logging.WARNING):
    logs = ctl.train()["train"]
  # 6e9 FLOP/s, above the peak given: MFU is of the loop's speed (1, not
  # 1.5), the peak raised to it and said once (test_peak_flops: a probed one).
  assert logs == {"loss": pytest.approx(np.mean(1 / np.arange(5, 9))),
                  "accuracy": 0.5, "learning_rate": 0.1,
                  "steps_per_sec": 2.0, "examples_per_sec": 8.0,
                  "tokens_per_sec": 200.0, "flops_per_sec": 6e9, "mfu": 1.0}
  assert given.flops_per_sec == 6e9
  assert [r.getMessage() for r in caplog.records] == [
      "A loop ran at 6 GFLOP/s, above the peak MFU was of (4 GFLOP/s): MFU"
      " is of the loop's speed from here on: the peak given is too low (or"
      " the FLOPs count too high); set --config.train.peak_flops to this"
      " machine's peak"]


# --- A run's figures: the counts of a CNN and of the LM -----------------------


RUNS = {  # name -> (config, FLOPs of a step, what a second counts)
    "cnn": (lambda tmp: configured(mnist.get_config("bundled"), {
        "model.width": 8, "train.batch_size": 8}),
            cnn_flops(8, 8), ("examples", 8)),
    "lm": (lambda tmp: configured(lm.get_config(), {
        **LM, "data.dir": str(_corpus(tmp / "corpus"))}),
           lm_flops(B * T), ("tokens", B * T)),
}


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.slow  # over 2 s: out of the fast lane
def test_a_run_reports_its_speed_everywhere_alike(name, tmp_path, caplog):
  make, step_flops, (count, per_step) = RUNS[name]
  c = configured(make(tmp_path), {
      "train.steps": 4, "train.steps_per_loop": 2, "train.peak_flops": 1e11,
      "checkpoint.every_steps": 0, "eval.every_steps": 0})
  # DEBUG: absl's --verbosity=1, whose detail line under each train row
  # holds the loop's speed.
  with caplog.at_level(logging.DEBUG, logger="absl"):
    run.run(c, str(tmp_path / "run"), mode="train")
  messages = [r.getMessage() for r in caplog.records]
  (header,) = [m for m in messages if m.startswith("looper train:")]
  assert header.splitlines()[-1] == (
      "  MFU        of 100 GFLOP/s: train.peak_flops=1e+11")
  if name == "lm":  # PaLM's 6 x ALL parameters: higher by what no matmul uses
    params = int(re.search(r"\(([\d,]+) parameters\)", header)[1]
                 .replace(",", ""))
    unused = T * W + L * 13 * W + 2 * W  # position embedding, LNs, biases
    assert step_flops == B * T * (6 * (params - unused) + 12 * L * T * W)
    assert step_flops == pytest.approx(
        B * T * (6 * params + 12 * L * T * W), rel=0.05)
  lines = {int(m.split()[2].split("/")[0]): detail
           for m, detail in zip(messages, messages[1:])
           if m.startswith("train step ")}
  rows = {r["step"]: r for r in jsonl.read(
      workdir_lib.Workdir(str(tmp_path / "run")).metrics)
          if r["kind"] == "train"}
  tensorboard = scalars(tmp_path / "run" / "train", "mfu")
  assert sorted(lines) == sorted(rows) == sorted(tensorboard) == [2, 4]
  for step, row in rows.items():
    # The count: the loop's FLOPs over its seconds (steps / steps_per_sec).
    assert row["flops_per_sec"] == pytest.approx(
        step_flops * row["steps_per_sec"], rel=1e-9)
    assert row["mfu"] == pytest.approx(row["flops_per_sec"] / 1e11, rel=1e-9)
    assert row[f"{count}_per_sec"] == pytest.approx(
        per_step * row["steps_per_sec"], rel=1e-6)
    assert tensorboard[step] == pytest.approx(row["mfu"], rel=1e-6)
    shown = re.match(r" +detail  ([\d.]+)(k?) " + count +
                     r"/s, ([\d.]+) (\w?)FLOP/s = ([\d.]+)% MFU", lines[step])
    assert shown, lines[step]
    rate, kilo, value, prefix, mfu = shown.groups()
    assert float(rate) * (1000 if kilo else 1) == pytest.approx(
        row[f"{count}_per_sec"], rel=5e-3)
    assert float(value) * 1000 ** " kMGT".index(prefix or " ") == (
        pytest.approx(row["flops_per_sec"], rel=5e-3))
    assert float(mfu) == pytest.approx(100 * row["mfu"], rel=5e-3)
