"""Stop, restart with more steps: the curve equals one uninterrupted run.

The stop (35 steps of 32 = 1120 examples) lies inside the second epoch of
the 1001-example train split and off the checkpoint interval (20), so the
restart must jump to epoch 1 and skip within it, from the final save.
On 2 replicas (the session's logical CPUs), in the test's process (no
command line is tested here; each run builds its pieces anew and reads
only the disk): the uninterrupted run and the first part; then the
restart, and a rerun at its end.
"""

import logging

import numpy as np
import pytest

from tests.fixtures.events import curve, scalars
from tests.fixtures.configs import run_here

# Four runs of seconds: the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

ARGS = ("--config=tests/fixtures/tiny.py",
        "--config.distribution.num_cpu_devices=2")


def test_resume_equals_uninterrupted_and_a_rerun_at_the_end_trains_nothing(
    tmp_path, caplog):
  whole, split = tmp_path / "whole", tmp_path / "split"
  run_here(*ARGS, f"--workdir={whole}", "--config.train.steps=50")
  run_here(*ARGS, f"--workdir={split}", "--config.train.steps=35")
  assert sorted(p.name for p in (split / "checkpoints").glob("*.index")) == [
      "ckpt-20.index", "ckpt-35.index"]
  printed = []  # what each of the last two runs logged
  for _ in range(2):
    caplog.clear()
    with caplog.at_level(logging.INFO):
      run_here(*ARGS, f"--workdir={split}", "--config.train.steps=50")
    printed.append(caplog.text)
  resumed, rerun = printed
  assert f"(resumed from {split}/checkpoints/ckpt-35)" in resumed

  # Every step 1..50 exactly once, after the rerun too (a step written
  # again fails `curve`): the rerun at the end wrote none.
  np.testing.assert_array_equal(curve(split / "train"), curve(whole / "train"))
  # The first part also evaluated at its own end, step 35.
  split_eval = scalars(split / "eval", "accuracy")
  assert sorted(split_eval) == [20, 35, 40, 50]
  del split_eval[35]
  assert split_eval == scalars(whole / "eval", "accuracy")
  # keep=3: the oldest of 20, 35, 40, 50 is gone.
  assert sorted(p.name for p in (split / "checkpoints").glob("*.index")) == [
      "ckpt-35.index", "ckpt-40.index", "ckpt-50.index"]
  # Once more at the end: nothing to train.
  assert "nothing to train" in rerun
  assert "nothing to train" not in resumed
