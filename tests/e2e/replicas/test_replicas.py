"""The same run on 1 and 2 replicas: the same curve, eval, health and per-step values.

One set of runs with every numerics option a replica step carries on: the
dropout masks, an active clip (the tiny run's gradient norms are ~0.5-2),
two micro-batches per update and the weight average (which eval uses); its
train_step returns per-step values beside the loss (tiny.StepValues).
The runs are the test's (`run_here`: the session's processes have 2
logical CPUs); logical CPU devices can only be set before TensorFlow
starts, so another count runs in a process of its own. 4 replicas (the same
code path as 2): `python -m tests.stress.replicas`, with these checks.
"""

import pathlib

import numpy as np
import pytest

from looper.workdir import jsonl
from tests.fixtures.configs import SESSION_CPUS, run_here
from tests.fixtures.events import curve, scalars
from tests.fixtures.processes import run_ok

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

REPLICAS = (1, 2)
NUMERICS = ("--config=tests/fixtures/tiny.py", "--config.model.dropout=0.3",
            "--config.optimizer.clip_global_norm=0.3",
            "--config.train.grad_accum_steps=2",
            "--config.optimizer.ema_decay=0.9", "--config.train.steps=20",
            "--config.eval.every_steps=10",
            "--config.trainer=tests.fixtures.tiny:StepValues",
            "--config.train.grad_norm=True")
# No clip: each replica squares 1/N of the summed gradient for the health
# figures (optimizers.share_of_squares), which the clip's norm cannot.
PLAIN = ("--config=tests/fixtures/tiny.py", "--config.train.steps=20",
         "--config.trainer=tests.fixtures.tiny:StepValues",
         "--config.train.grad_norm=True")


def run_all(root: pathlib.Path, replicas) -> dict:
  """The workdirs of the run on 1 and each of `replicas`, and the plain's."""
  out = {n: root / f"replicas{n}" for n in (1, *replicas)}
  out.update({("plain", n): root / f"plain{n}" for n in (1, *replicas)})
  out["plain"] = out["plain", 1]
  run_here(*NUMERICS, f"--workdir={out[1]}")
  run_here(*PLAIN, f"--workdir={out['plain']}")
  for n in replicas:  # the session's count here, another in a process
    run = run_here if n == SESSION_CPUS else run_ok
    devices = f"--config.distribution.num_cpu_devices={n}"
    run(*NUMERICS, f"--workdir={out[n]}", devices)
    run(*PLAIN, f"--workdir={out['plain', n]}", devices)
  return out


def check_curves(runs, replicas):
  reference = curve(runs[1] / "train")
  assert len(reference) == 20
  for n in replicas:
    np.testing.assert_allclose(curve(runs[n] / "train"), reference,
                               rtol=1e-5, err_msg=f"{n} replicas")
  # And they did something: the curve is not the plain run's.
  assert np.abs(reference - curve(runs["plain"] / "train")).max() > 1e-3


def check_eval(runs, replicas):
  # 1001 eval examples, eval batch 64 (32 per replica on 2, 16 on 4): 16
  # steps, the last one padded with 23 masked examples.
  for n in (1, *replicas):
    assert scalars(runs[n] / "eval", "examples") == {10: 1001, 20: 1001}
  for tag in ("loss", "accuracy"):
    want = scalars(runs[1] / "eval", tag)
    for n in replicas:
      got = scalars(runs[n] / "eval", tag)
      assert got.keys() == want.keys()
      np.testing.assert_allclose(list(got.values()), list(want.values()),
                                 rtol=1e-5, atol=1e-6, err_msg=f"{tag} on {n}")


def check_train_metrics(runs, replicas):
  want = scalars(runs[1] / "train", "accuracy")
  assert list(want) == [10, 20]  # each loop's end (steps_per_loop=10)
  for n in replicas:
    got = scalars(runs[n] / "train", "accuracy")
    assert got.keys() == want.keys(), n
    np.testing.assert_allclose(list(got.values()), list(want.values()),
                               atol=1e-6)


def check_health(runs, replicas):
  """grad_norm (before the clip: above its 0.3), grad_norm_max, weight_norm
  and update_ratio are of the global batch's update, so more replicas give
  1's (which test_math checks against NumPy), clipped or not (the norm
  taken whole on each replica, or 1/N of it)."""
  tags = ("grad_norm", "grad_norm_max", "weight_norm", "update_ratio")
  for run in (lambda n: runs[n], lambda n: runs["plain", n]):
    want = {tag: scalars(run(1) / "train", tag) for tag in tags}
    assert max(want["grad_norm_max"].values()) > 0.3
    for n in replicas:
      for tag, values in want.items():
        got = scalars(run(n) / "train", tag)
        assert got.keys() == values.keys() == {10, 20}, (tag, n)
        np.testing.assert_allclose(list(got.values()), list(values.values()),
                                   rtol=1e-5, err_msg=f"{tag} on {n}")


def check_step_values(runs, replicas):
  """tiny.StepValues' values, each replica's share summed: each step's
  examples are its update's (2 micro-batches of 32; 32 in the plain run),
  its mean label the same on every replica count; metrics.jsonl's train
  lines hold each loop's mean of the steps' values TensorBoard has."""
  for run, examples in ((lambda n: runs[n], 64), (lambda n: runs["plain", n],
                                                   32)):
    want = curve(run(1) / "train", "label_mean")
    assert len(want) == 20 and 0 < want.min() < want.max() < 3
    for n in (1, *replicas):
      got = {name: curve(run(n) / "train", name)
             for name in ("label_mean", "examples")}
      np.testing.assert_array_equal(got["examples"], np.full(20, examples))
      np.testing.assert_allclose(got["label_mean"], want, rtol=1e-6,
                                 err_msg=f"{n} replicas")
      lines = [l for l in jsonl.read(str(run(n) / "metrics.jsonl"))
               if l["kind"] == "train"]
      assert [l["step"] for l in lines] == [10, 20], n
      for name, values in got.items():
        np.testing.assert_allclose([l[name] for l in lines],
                                   values.reshape(2, 10).mean(axis=1),
                                   rtol=1e-6, err_msg=f"{name} on {n}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return run_all(tmp_path_factory.mktemp("replicas"), REPLICAS[1:])


def test_dropout_clipping_accumulation_ema_are_the_same_on_1_and_2_replicas(
    runs):
  check_curves(runs, REPLICAS[1:])


def test_eval_counts_1001_examples_on_every_replica_count(runs):
  check_eval(runs, REPLICAS[1:])


def test_train_metrics_agree_across_replicas(runs):
  check_train_metrics(runs, REPLICAS[1:])


def test_health_figures_are_the_global_update_s_on_every_replica_count(runs):
  check_health(runs, REPLICAS[1:])


def test_per_step_values_are_the_global_batch_s_on_every_replica_count(runs):
  check_step_values(runs, REPLICAS[1:])
