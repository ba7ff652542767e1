"""MNIST end to end through looper.main on the real offline test set.

Trains the TPU-guide CNN (narrowed to width 32) on the first 8000 real test
images and evaluates on the other 2000 (the `:bundled` preset, the README's
quickstart): a real, non-synthetic accuracy check.
"""

import json

import pytest

from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import MNIST_DIR
from tests.fixtures.processes import run_ok

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow


def test_mnist_reaches_97_percent_offline(tmp_path):
  # The README quickstart's preset: the bundled test set, 8000 / 2000.
  run_ok("--config=experiments/mnist.py:bundled", f"--workdir={tmp_path}",
         "--config.eval.every_steps=500",
         "--config.checkpoint.every_steps=500", timeout=600)
  accuracy = scalars(tmp_path / "eval", "accuracy")
  assert sorted(accuracy) == [500, 1000]
  assert accuracy[1000] >= 0.97, accuracy
  assert scalars(tmp_path / "eval", "examples") == {500: 2000, 1000: 2000}
  losses = curve(tmp_path / "train")
  assert len(losses) == 1000 and losses[-100:].mean() < losses[:100].mean() / 5
  assert (tmp_path / "checkpoints" / "ckpt-1000.index").exists()
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["data"]["train_split"] == "test[:8000]"
  assert saved["data"]["dir"] == str(MNIST_DIR)
  assert saved["model_fn"] == "experiments/mnist.py:model_fn"
