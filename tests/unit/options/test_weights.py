"""Sample and class weights, token losses and several outputs: the math.

Training is compared with plain single-device SGD on the same global
batches (`weighted.reference_losses`: the loss written out from BUILD.md
"Losses", not looper's code) on 1 and 2 replicas and under accumulation
(the cases on 4 replicas: `python -m tests.stress.weights`); evaluation
with NumPy over the whole split, in the element, array and file input
modes, and over each of several eval sets.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

from looper import run
from looper.data import shards
from looper.options import distribute
from tests.fixtures import pieces
from tests.fixtures import weighted
from tests.fixtures.checkpoints import restored_trainer
from tests.fixtures.configs import SESSION_CPUS, configured
from tests.fixtures.events import scalars

STEPS = 10
CLASS_WEIGHTS = (1.0, 3.0, 0.5, 2.0)
# Two eval sets, each with a padded last batch on every replica count: the
# tokens case evaluates them after training, beside NumPy over the model's
# outputs (the sets change nothing in training).
SETS = {"val": "test[:30%]", "test": "test[30%:]"}
ROWS = {"val": slice(0, 300), "test": slice(300, None)}
# The replica counts checked here; 4 (a process of its own, another 9 s):
# tests/stress/weights.py, the same code path as 2.
SUITE = (1, 2)

# (name, kind, fields, replica counts)
CASES = [
    ("examples", "examples", {}, (1, 2, 4)),
    ("examples-by-weights-accum", "examples",
     {"loss_normalization": "weights", "train.grad_accum_steps": 2,
      "data.mode": "arrays"}, (1, 2, 4)),
    ("class-weights", "examples",
     {"data.class_weights": CLASS_WEIGHTS, "data.mode": "arrays"}, (1, 2)),
    ("tokens", "tokens", {"data.eval_splits": SETS, "eval.batch_size": 64},
     (1, 2, 4)),
    ("tokens-accum", "tokens", {"train.grad_accum_steps": 2}, (2,)),
    ("heads", "heads", {}, (1, 2)),
]


def cases(files) -> list:
  """CASES and file mode's, over 8 shards written into `files`."""
  x, y, w = weighted.make_data("examples", 1000, 0)
  shards.write(tf.data.Dataset.from_tensor_slices((x, y, w)),
               str(files / "train"), min_shards=8)
  shards.write(tf.data.Dataset.from_tensor_slices(
      weighted.make_data("examples", 1000, 1)), str(files / "test"),
               min_shards=8)
  return CASES + [("files", "examples", {"data.shards_dir": str(files)},
                   (1, 2, 4))]

def results(strategy, n: int, cases) -> dict:
  """{"case/n": losses and weights after STEPS (with eval sets, then the
  evaluation and the model's outputs on the test split)} of each case run
  on `n` replicas (`strategy`'s)."""
  out, kept = {}, []
  for name, kind, fields, replicas in cases:
    if n in replicas:
      c = configured(weighted.get_config(kind), fields)
      if "data.shards_dir" in fields:
        c.data.virtual_shards = 8
      t = pieces.trainer(c, strategy)
      losses = t.train(STEPS)[0]["loss"]
      out[f"{name}/{n}"] = dict(
          losses=losses.tolist(),
          weights=[v.numpy().tolist() for v in t.model.trainable_variables])
      if "data.eval_splits" in fields:
        x, _, _ = weighted.make_data(kind, c.model.num_examples, 1)
        out[f"{name}/{n}"].update(
            eval=pieces.evaluator(t).evaluate(),
            outputs=t.model(x).numpy().tolist())
      kept.append(t)  # a Mirrored iterator freed while others run stalls
  return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Every case on its SUITE replica counts: 1, and 2 on the session's
  logical CPUs (tests/conftest.py)."""
  every = cases(tmp_path_factory.mktemp("shards"))
  out = results(tf.distribute.get_strategy(), 1, every)
  out.update(results(distribute.mirrored(distribute.split_cpu(SESSION_CPUS)),
                     SESSION_CPUS, every))
  return out


def check_case(runs, name, kind, fields, n):
  """Case `name` on `n` replicas (`runs`) equals single-device SGD."""
  c = configured(weighted.get_config(kind), fields)
  want, weights = weighted.reference_losses(
      c, STEPS, CLASS_WEIGHTS if fields.get("data.class_weights") else None)
  got = runs[f"{name}/{n}"]
  np.testing.assert_allclose(got["losses"], want, rtol=2e-5, atol=1e-6,
                             err_msg=f"{name} on {n} replicas")
  for a, b in zip(got["weights"], weights):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # 2 replicas: seconds
@pytest.mark.parametrize("name,kind,fields,replicas", CASES,
                         ids=[c[0] for c in CASES])
def test_training_equals_single_device_sgd(runs, name, kind, fields,
                                           replicas):
  for n in set(replicas) & set(SUITE):
    check_case(runs, name, kind, fields, n)


@pytest.mark.slow  # 2 replicas: seconds
def test_the_weights_and_the_normalization_matter(runs):
  """Controls: the cases above would fail if looper ignored the weights or
  divided by the wrong count."""
  unweighted, _ = weighted.reference_losses(weighted.get_config("examples"),
                                            STEPS, unweighted=True)
  assert not np.allclose(runs["examples/2"]["losses"], unweighted, rtol=1e-3)
  # Skewed token counts: dividing by every token slot, not the global count
  # of real tokens, gives another curve.
  tokens = weighted.get_config("tokens")
  tokens.loss_normalization = "batch_size"
  per_slot, _ = weighted.reference_losses(tokens, STEPS)
  assert not np.allclose(runs["tokens/2"]["losses"], per_slot, rtol=1e-3)


def file_order(num: int, files: int, groups: int, batch: int,
               steps: int) -> np.ndarray:
  """The examples file mode's global batches take, written out from
  looper/data/shards.py's doc: file i holds examples [i*num//files,
  (i+1)*num//files) and is in group i mod `groups`; a group's stream is its
  files in order, again each epoch (no shuffle); global batch k takes the
  next batch/groups examples of every group, in group order."""
  bounds = [i * num // files for i in range(files + 1)]
  streams = [np.concatenate([np.arange(bounds[i], bounds[i + 1])
                             for i in range(g, files, groups)])
             for g in range(groups)]
  per = batch // groups
  return np.concatenate([s[np.arange(k * per, (k + 1) * per) % len(s)]
                         for k in range(steps) for s in streams])


def check_files(runs, replicas):
  """File mode on each of `replicas` (`runs`) equals one replica and
  single-device SGD on the examples the groups deal, with their sample
  weights (8 files, 8 groups: `cases`)."""
  for n in replicas:
    np.testing.assert_allclose(runs[f"files/{n}"]["losses"],
                               runs["files/1"]["losses"], rtol=1e-5)
  c = weighted.get_config("examples")
  order = file_order(c.model.num_examples, 8, 8, c.train.batch_size, STEPS)
  want, weights = weighted.reference_losses(c, STEPS, order=order)
  for n in (1, *replicas):
    got = runs[f"files/{n}"]
    np.testing.assert_allclose(got["losses"], want, rtol=2e-5, atol=1e-6,
                               err_msg=f"files on {n} replicas")
    for a, b in zip(got["weights"], weights):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  # Controls: without the weights, or in the split's order, another curve.
  unweighted, _ = weighted.reference_losses(c, STEPS, order=order,
                                            unweighted=True)
  in_order, _ = weighted.reference_losses(c, STEPS)
  for other in (unweighted, in_order):
    assert not np.allclose(runs[f"files/{replicas[0]}"]["losses"], other,
                           rtol=1e-3)


@pytest.mark.slow  # 2 replicas: seconds
def test_file_mode_is_the_same_on_1_and_2_replicas(runs):
  check_files(runs, (2,))


def _softmax_ce(logits, labels):
  shifted = logits - logits.max(-1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]


def numpy_eval(kind: str, outputs, y, w) -> dict:
  """The eval logs BUILD.md "Losses" defines, over the whole split."""
  if kind == "heads":
    ce = _softmax_ce(outputs["class"], y["class"])
    se = ((y["value"] - outputs["value"]) ** 2).mean(-1)
    n = len(w)
    logs = {"class/loss": (w * ce).sum() / n, "value/loss": (w * se).sum() / n,
            "class/accuracy": (w * (outputs["class"].argmax(-1) ==
                                    y["class"])).sum() / w.sum(),
            "value/mean_squared_error": (w * se).sum() / w.sum()}
    logs["loss"] = logs["class/loss"] + 0.5 * logs["value/loss"]
    return logs
  ce = _softmax_ce(outputs, y)
  # tokens: loss_normalization='weights' (the real tokens); examples: Keras'
  # rule (every example).
  denominator = w.sum() if kind == "tokens" else w.size
  return {"loss": (w * ce).sum() / denominator,
          "accuracy": (w * (outputs.argmax(-1) == y)).sum() / w.sum()}


@pytest.mark.parametrize("mode", ["elements", "arrays", "files"])
@pytest.mark.parametrize("kind", ["examples", "tokens", "heads"])
def test_eval_is_weighted_over_the_whole_split(tmp_path, kind, mode):
  """1000 examples in batches of 64: the last one padded, masked."""
  c = weighted.get_config(kind)
  c.eval.batch_size = 64
  x, y, w = weighted.make_data(kind, 1000, 1)
  if mode == "files":
    for split, seed in (("train", 0), ("test", 1)):
      shards.write(tf.data.Dataset.from_tensor_slices(
          weighted.make_data(kind, 1000, seed)), str(tmp_path / split),
                   min_shards=4)
    c.data.shards_dir = str(tmp_path)
  else:
    c.data.mode = mode
  t = pieces.trainer(c, tf.distribute.get_strategy())
  got = pieces.evaluator(t).evaluate()
  outputs = tf.nest.map_structure(lambda o: o.numpy(), t.model(x))
  want = numpy_eval(kind, outputs, y, w)
  assert got["examples"] == 1000
  assert set(got) == {"examples", *want}
  for name, value in want.items():
    assert got[name] == pytest.approx(value, rel=1e-5), name


def assert_each_set_exact(kind: str, got: dict, outputs, where: str = ""):
  """`got`, eval logs of the sets SETS names, against NumPy over `outputs`
  (the model's, of the whole test split) sliced by each set's ROWS."""
  _, y, w = weighted.make_data(kind, 1000, 1)
  want = {}
  for name, rows in ROWS.items():
    part = tf.nest.map_structure(lambda a, r=rows: a[r], (outputs, y, w))
    want[f"{name}/examples"] = len(part[2])
    want.update({f"{name}/{k}": v
                 for k, v in numpy_eval(kind, *part).items()})
  assert set(got) == set(want), where
  for name, value in want.items():
    assert got[name] == pytest.approx(value, rel=1e-5), f"{name} {where}"


@pytest.mark.slow  # 2 replicas: seconds
def test_each_eval_set_is_exact_on_1_and_2_replicas(runs):
  for n in SUITE:
    got = runs[f"tokens/{n}"]
    assert_each_set_exact("tokens", got["eval"], np.array(got["outputs"]),
                          f"on {n} replicas")


def test_each_eval_set_is_exact_with_several_outputs():
  """Per-output names under each set: 'val/class/accuracy'."""
  c = configured(weighted.get_config("heads"), {"data.eval_splits": SETS,
                                                 "eval.batch_size": 64})
  t = pieces.trainer(c, tf.distribute.get_strategy())
  evaluator = pieces.evaluator(t)
  assert evaluator.metric_names == [
      f"{s}/{n}" for s in ("test", "val") for n in (
          "loss", "class/loss", "value/loss", "class/accuracy",
          "value/mean_squared_error")]
  got = evaluator.evaluate()
  x, _, _ = weighted.make_data("heads", 1000, 1)
  outputs = tf.nest.map_structure(lambda o: o.numpy(), t.model(x))
  assert_each_set_exact("heads", got, outputs)


def test_class_weights_and_sample_weights_multiply():
  """Step 1's loss (before any update) against NumPy, dict class weights."""
  c = weighted.get_config("examples")
  c.data.class_weights = {1: 3.0, 3: 2.0}  # classes 0 and 2 weigh 1
  t = pieces.trainer(c, tf.distribute.get_strategy())
  x, y, w = weighted.make_data("examples", 1000, 0)
  ce = _softmax_ce(t.model(x[:32]).numpy(), y[:32])
  by_class = np.array([1.0, 3.0, 1.0, 2.0])[y[:32]]
  losses = t.train(1)[0]["loss"]
  assert losses[0] == pytest.approx((w[:32] * by_class * ce).sum() / 32,
                                    rel=1e-5)


def test_two_heads_end_to_end(tmp_path, caplog):
  """Per-output metrics in the logs, TensorBoard and the progress line;
  the export serves both outputs."""
  c = configured(weighted.get_config("heads"), {
      "train.steps": 20, "eval.every_steps": 0, "export.at_end": True,
      "optimizer.momentum": 0.9})
  with caplog.at_level(logging.INFO, logger="absl"):
    result = run.run(c, str(tmp_path), "train_and_eval")
  names = {"loss", "class/loss", "value/loss", "class/accuracy",
           "value/mean_squared_error", "examples"}
  assert set(result["eval"]) == names
  assert result["eval"]["loss"] == pytest.approx(
      result["eval"]["class/loss"] + 0.5 * result["eval"]["value/loss"])
  for tag in ("class/accuracy", "value/mean_squared_error"):
    assert list(scalars(tmp_path / "train", tag)) == [10, 20]
    assert list(scalars(tmp_path / "eval", tag)) == [20]
  said = [r.getMessage() for r in caplog.records]
  # The train rows' header row names each output's metric, and the row
  # of step 20 has a figure under each name.
  [heading] = [m for m in said if m.startswith(" ") and m.endswith(" ETA")]
  [row] = [m for m in said if m.startswith("train step 20/20")]
  assert {"class/accuracy", "value/mean_squared_error"} <= set(
      heading.split())
  assert len(row.split()) == len(["train", "step", "20/20"]) + len(
      heading.split())
  serve = tf.saved_model.load(str(tmp_path / "export" / "20")).signatures[
      "serving_default"]
  x, _, _ = weighted.make_data("heads", 5, 3)
  served = serve(inputs=tf.constant(x))
  assert set(served) == {"class", "value"}
  model = restored_trainer(c, tmp_path / "checkpoints" / "ckpt-20").model
  for name, value in model(x).items():
    np.testing.assert_allclose(served[name], value, rtol=1e-5, atol=1e-6)
