"""The same run on 1 and 2 replicas: the same curve, eval and health.

One set of runs with every numerics option a replica step carries on: the
dropout masks, an active clip (the tiny run's gradient norms are ~0.5-2),
two micro-batches per update and the weight average (which eval uses).
The runs are the test's (`run_here`: the session's processes have 2
logical CPUs); logical CPU devices can only be set before TensorFlow
starts, so another count runs in a process of its own. 4 replicas (the same
code path as 2): `python -m tests.stress.replicas`, with these checks.
"""

import pathlib

import numpy as np
import pytest

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
            "--config.eval.every_steps=10")


def run_all(root: pathlib.Path, replicas) -> dict:
  """The workdirs of the run on 1 and each of `replicas`, and the plain's."""
  out = {n: root / f"replicas{n}" for n in (1, *replicas)}
  out["plain"] = root / "plain"
  run_here(*NUMERICS, f"--workdir={out[1]}")
  for n in replicas:  # the session's count here, another in a process
    (run_here if n == SESSION_CPUS else run_ok)(
        *NUMERICS, f"--workdir={out[n]}",
        f"--config.distribution.num_cpu_devices={n}")
  run_here("--config=tests/fixtures/tiny.py", "--config.train.steps=20",
           f"--workdir={out['plain']}")
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
  1's (which test_math checks against NumPy)."""
  want = {tag: scalars(runs[1] / "train", tag) for tag in (
      "grad_norm", "grad_norm_max", "weight_norm", "update_ratio")}
  assert max(want["grad_norm_max"].values()) > 0.3
  for n in replicas:
    for tag, values in want.items():
      got = scalars(runs[n] / "train", tag)
      assert got.keys() == values.keys() == {10, 20}, (tag, n)
      np.testing.assert_allclose(list(got.values()), list(values.values()),
                                 rtol=1e-5, err_msg=f"{tag} on {n}")


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
