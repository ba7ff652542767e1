"""The same config on 1, 2 and 4 replicas: the same curve, the same eval.

Each run is its own process: one MirroredStrategy per process, and logical
CPU devices can only be set before TensorFlow starts.
"""

import numpy as np
import pytest

from tests.conftest import curve, run_ok, scalars

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

REPLICAS = (1, 2, 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  out = {}
  for n in REPLICAS:
    workdir = tmp_path_factory.mktemp(f"replicas{n}")
    run_ok("--config=tests/tiny.py", f"--workdir={workdir}",
           f"--config.distribution.num_cpu_devices={n}")
    out[n] = workdir
  return out


def test_same_loss_curve_on_1_2_4_replicas(runs):
  reference = curve(runs[1] / "train")
  assert len(reference) == 40
  for n in REPLICAS[1:]:
    np.testing.assert_allclose(curve(runs[n] / "train"), reference,
                               atol=1e-5, err_msg=f"{n} replicas")


def test_eval_counts_1001_examples_on_every_replica_count(runs):
  # 1001 eval examples, eval batch 64 (16 per replica on 4): 16 steps, the
  # last one padded with 23 masked examples.
  for n in REPLICAS:
    assert scalars(runs[n] / "eval", "examples") == {20: 1001, 40: 1001}
  for tag in ("loss", "accuracy"):
    want = scalars(runs[1] / "eval", tag)
    for n in REPLICAS[1:]:
      got = scalars(runs[n] / "eval", tag)
      assert got.keys() == want.keys()
      np.testing.assert_allclose(list(got.values()), list(want.values()),
                                 atol=1e-5, err_msg=f"{tag} on {n}")


def test_train_metrics_agree_across_replicas(runs):
  want = scalars(runs[1] / "train", "accuracy")
  for n in REPLICAS[1:]:
    got = scalars(runs[n] / "train", "accuracy")
    np.testing.assert_allclose(list(got.values()), list(want.values()),
                               atol=1e-6)
