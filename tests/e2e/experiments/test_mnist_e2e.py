"""MNIST end to end through looper's run on the real offline test set.

Trains the TPU-guide CNN (narrowed to width 32) on the first 8000 real test
images and evaluates on the other 2000 (the `:bundled` preset, the README's
quickstart): a real, non-synthetic learning check, shortened to 200 of its
1000 steps (0.94 measured at step 200), in this process (the console
script's way into the same run: e2e/commands/test_cli.py). The whole
quickstart and its 97% are a command outside the suite (README's
quickstart; BUILD.md's offline newcomer check).
"""

import json

import pytest

from tests.fixtures.configs import run_here
from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import MNIST_DIR

# Trains for seconds: the slow lane (BUILD.md).
pytestmark = pytest.mark.slow


def test_mnist_learns_offline(tmp_path):
  # The README quickstart's preset: the bundled test set, 8000 / 2000.
  run_here("--config=experiments/mnist.py:bundled", f"--workdir={tmp_path}",
           "--config.train.steps=200", "--config.eval.every_steps=100",
           "--config.checkpoint.every_steps=100")
  accuracy = scalars(tmp_path / "eval", "accuracy")
  assert sorted(accuracy) == [100, 200]
  # Ten classes: chance is 0.1; 0.94 measured at 200 (AMD EPYC), 0.98 at
  # the quickstart's 1000.
  assert accuracy[200] >= 0.9, accuracy
  assert scalars(tmp_path / "eval", "examples") == {100: 2000, 200: 2000}
  losses = curve(tmp_path / "train")
  assert len(losses) == 200 and losses[-50:].mean() < losses[:50].mean() / 3
  assert (tmp_path / "checkpoints" / "ckpt-200.index").exists()
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["data"]["train_split"] == "test[:8000]"
  assert saved["data"]["dir"] == str(MNIST_DIR)
  # Named by its file, or by module if this process imported it as one
  # (unit/floor/test_references.py).
  assert saved["model_fn"] in ("experiments/mnist.py:model_fn",
                               "experiments.mnist:model_fn")
