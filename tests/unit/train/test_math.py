"""Loss, metrics and eval of a real run against an independent NumPy model.

The model is softmax regression with an L2 kernel regularizer trained by SGD
with momentum; NumPy computes the same steps by hand (forward, gradients,
momentum update), so every per-step loss read back from the event files, the
train accuracy of the last loop, the eval metrics over all 1001 eval
examples, each loop's health figures (looper.measure.health) and the
per-step values a train_step returns beside its loss must match it.
"""

import json

import keras
import numpy as np
import pytest

from looper import run
from tests.fixtures import tiny
from tests.fixtures.events import curve, scalars

L2 = 1e-2
LR = 0.1
MOMENTUM = 0.9
RNG = np.random.default_rng(7)
W0 = RNG.normal(scale=0.1, size=(tiny.FEATURES, tiny.NUM_CLASSES))
B0 = RNG.normal(scale=0.1, size=(tiny.NUM_CLASSES,))


def linear_model_fn(config):
  return keras.Sequential([
      keras.Input((tiny.FEATURES,)),
      keras.layers.Dense(
          tiny.NUM_CLASSES, kernel_regularizer=keras.regularizers.L2(L2),
          kernel_initializer=keras.initializers.Constant(W0),
          bias_initializer=keras.initializers.Constant(B0)),
  ])


def _softmax_ce(x, y, w, b):
  logits = x @ w + b
  logits -= logits.max(axis=1, keepdims=True)
  p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
  ce = -np.log(p[np.arange(len(y)), y])
  return ce, p, logits.argmax(axis=1) == y


def numpy_reference(steps, batch, steps_per_loop):
  """Per-step total losses, last loop's train accuracy, final eval metrics,
  and each loop's health figures by its last step."""
  x, y = tiny.make_data(1001, seed=0)
  w, b = W0.copy(), B0.copy()
  vw, vb = np.zeros_like(w), np.zeros_like(b)
  losses, correct, norms, health = [], [], [], {}
  start = np.concatenate([w.ravel(), b])
  for step in range(steps):
    # No shuffling: global example i of the stream is example i % 1001.
    idx = np.arange(step * batch, (step + 1) * batch) % len(x)
    ce, p, hit = _softmax_ce(x[idx], y[idx], w, b)
    losses.append(ce.mean() + L2 * np.sum(w * w))
    correct.append(hit)
    d = p.copy()
    d[np.arange(batch), y[idx]] -= 1
    d /= batch
    gw, gb = x[idx].T @ d + 2 * L2 * w, d.sum(axis=0)
    norms.append(np.sqrt(np.sum(gw * gw) + np.sum(gb * gb)))
    vw, vb = MOMENTUM * vw - LR * gw, MOMENTUM * vb - LR * gb
    w, b = w + vw, b + vb
    if (step + 1) % steps_per_loop == 0:  # a loop's end: its figures
      now = np.concatenate([w.ravel(), b])
      health[step + 1] = dict(
          grad_norm=np.mean(norms), grad_norm_max=np.max(norms),
          weight_norm=np.linalg.norm(now),
          update_ratio=np.linalg.norm(now - start) / np.linalg.norm(start))
      norms, start = [], now
  ex, ey = tiny.make_data(1001, seed=1)
  ce, _, hit = _softmax_ce(ex, ey, w, b)
  last_loop = np.concatenate(correct[-steps_per_loop:])
  return (np.array(losses), last_loop.mean(),
          {"loss": ce.mean(), "accuracy": hit.mean(), "examples": 1001},
          health)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("math")
  c = tiny.get_config()
  c.model_fn = linear_model_fn
  c.trainer = tiny.StepValues  # the same loss, two per-step values beside
  c.data.shuffle_buffer = 0
  c.optimizer.momentum = MOMENTUM
  c.optimizer.learning_rate = LR
  c.train.steps, c.train.steps_per_loop = 40, 10
  c.train.grad_norm = True
  result = run.run(c, str(workdir))
  return workdir, result


def test_per_step_loss_matches_numpy(reference_run):
  workdir, _ = reference_run
  want, *_ = numpy_reference(40, 32, 10)
  np.testing.assert_allclose(curve(workdir / "train"), want, rtol=2e-5)


def test_train_and_eval_metrics_match_numpy(reference_run):
  _, result = reference_run
  _, train_accuracy, want_eval, _ = numpy_reference(40, 32, 10)
  assert result["train"]["accuracy"] == pytest.approx(train_accuracy, abs=1e-6)
  assert result["eval"]["examples"] == 1001
  assert result["eval"]["accuracy"] == pytest.approx(want_eval["accuracy"],
                                                     abs=1e-6)
  assert result["eval"]["loss"] == pytest.approx(want_eval["loss"], rel=1e-5)


def test_health_figures_match_numpy(reference_run):
  """Each loop's gradient norms (mean and max over its 10 updates, the L2
  term's gradient in), weight norm and update ratio, as TensorBoard and
  metrics.jsonl have them (global on any replica count: test_replicas)."""
  workdir, result = reference_run
  want = numpy_reference(40, 32, 10)[3]
  lines = [json.loads(line) for line in
           (workdir / "metrics.jsonl").read_text().splitlines()]
  for name in ("grad_norm", "grad_norm_max", "weight_norm", "update_ratio"):
    got = scalars(workdir / "train", name)
    assert sorted(got) == [10, 20, 30, 40], name
    for step, figures in want.items():
      assert got[step] == pytest.approx(figures[name], rel=2e-5), (name, step)
    assert {l["step"]: l[name] for l in lines if l["kind"] == "train"} == (
        pytest.approx(got, rel=1e-6)), name
  assert result["train"]["grad_norm_max"] > result["train"]["grad_norm"]


def test_per_step_values_match_numpy(reference_run):
  """A train_step's values beside its loss (tiny.StepValues: the update's
  mean label, its examples): each step's in TensorBoard, each loop's mean
  in metrics.jsonl and the result, as NumPy has them from the data."""
  workdir, result = reference_run
  _, y = tiny.make_data(1001, seed=0)
  labels = np.array([y[np.arange(s * 32, (s + 1) * 32) % len(y)]
                     for s in range(40)])  # no shuffling: the stream in order
  want = {"label_mean": labels.mean(axis=1), "examples": np.full(40, 32.0)}
  lines = [l for l in map(json.loads, (workdir / "metrics.jsonl").read_text(
      ).splitlines()) if l["kind"] == "train"]
  assert [l["step"] for l in lines] == [10, 20, 30, 40]
  for name, per_step in want.items():
    np.testing.assert_allclose(curve(workdir / "train", name), per_step,
                               rtol=1e-6, err_msg=name)
    np.testing.assert_allclose([l[name] for l in lines],
                               per_step.reshape(4, 10).mean(axis=1),
                               rtol=1e-6, err_msg=name)
    # The steps' own values are the curve: no loop mean among them.
    assert sorted(scalars(workdir / "train", name)) == list(range(1, 41))
  assert result["train"]["label_mean"] == pytest.approx(
      want["label_mean"][30:].mean(), rel=1e-6)
  # In the train line's order: the loss, the values, then the metrics.
  assert list(lines[0])[3:7] == ["loss", "label_mean", "examples", "accuracy"]


def test_summaries_read_back(reference_run):
  workdir, result = reference_run
  train_tags = ("accuracy", "learning_rate", "steps_per_sec",
                "examples_per_sec")
  for tag in train_tags:  # written once per loop, at the loop's last step
    assert sorted(scalars(workdir / "train", tag)) == [10, 20, 30, 40], tag
  assert scalars(workdir / "train", "learning_rate")[40] == pytest.approx(LR)
  assert scalars(workdir / "train", "accuracy")[40] == pytest.approx(
      result["train"]["accuracy"])
  # eval.every_steps=20 in the tiny config.
  assert scalars(workdir / "eval", "examples") == {20: 1001, 40: 1001}
  assert scalars(workdir / "eval", "accuracy")[40] == pytest.approx(
      result["eval"]["accuracy"])
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(
      str(workdir / "train"), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  [text] = acc.Tensors("config")
  assert "linear_model_fn" in text.tensor_proto.string_val[0].decode()
  config = json.loads((workdir / "config.json").read_text())
  assert config["model_fn"] == "tests.unit.train.test_math:linear_model_fn"
  assert config["train"]["steps"] == 40
