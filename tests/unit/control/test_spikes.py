"""Loss spikes: the guard's median by hand, then real runs on data that spikes.

The guard against hand-computed medians and its checkpointed losses; a real
run whose batch of step 33 has its features x30 (tests/fixtures/spiky.py)
rolls that loop back once, with one line, and ends where a run that never
saw the skipped examples ends (the independent reference); ended after step
30 and resumed from ckpt-20, it does the same from the restored losses
(without them the resumed run would know the 10 steps it replayed, fewer
than spikes.MIN_STEPS, and train through the spike). With the factor at 0
the run trains through the spike and its checkpoints hold no losses.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

from looper import workdir
from looper.control import spikes
from looper.workdir import checkpoint
from tests.fixtures import pieces
from tests.fixtures import spiky
from tests.fixtures import tiny
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.configs import run_here
from tests.fixtures.events import curve

SPIKY = "--config=tests/fixtures/spiky.py"


def guard_with(losses, factor=5.0):
  """A guard that kept `losses`, a loop of 10 steps at a time."""
  guard = spikes.SpikeGuard(tf.distribute.get_strategy(), factor)
  for i in range(0, len(losses), 10):
    guard.add(np.array(losses[i:i + 10], np.float32))
  return guard


def test_a_spike_is_a_loss_above_factor_times_the_recent_median():
  # 10 steps each of 1, 2, 3, 100: median 2.5, a spike above 12.5.
  guard = guard_with(np.repeat([1.0, 2.0, 3.0, 100.0], 10))
  assert guard.spike(np.array([1.0, 12.5, 2.0]), first_step=31) is None
  assert guard.spike(np.array([1.0, 12.75, 2.0]), first_step=31) == (
      "train loss spiked to 12.75 at step 32, above train.spike_factor=5 x"
      " 2.5 (the median loss of the last 40 steps)")
  # A kept loop's steps join: 10 of 40 more, median 3.
  guard.add(np.full([10], 40.0, np.float32))
  assert guard.spike(np.array([15.0]), 1) is None
  assert guard.spike(np.array([15.25]), 1) is not None


def test_only_with_enough_steps_and_a_positive_median():
  assert guard_with([1.0] * (spikes.MIN_STEPS - 1)).spike(
      np.array([1e9]), 1) is None
  assert guard_with([1.0] * spikes.MIN_STEPS).spike(
      np.array([1e9]), 1) is not None
  assert guard_with([-1.0] * 90).spike(np.array([1e9]), 1) is None


def test_the_last_window_of_steps_counts_and_is_checkpointed(tmp_path):
  # 1500 steps 1..1500: the last 1000 (501..1500) are kept, median 1000.5.
  steps = np.arange(1.0, 1 + 1.5 * spikes.WINDOW)
  guard = guard_with(steps)
  assert guard.spike(np.array([5 * 1000.5 + 1]), 1) is not None
  assert guard.spike(np.array([5 * 1000.5 - 1]), 1) is None
  path = tf.train.Checkpoint(**guard.checkpoint_items()).save(
      str(tmp_path / "ckpt"))
  restored = guard_with([])
  tf.train.Checkpoint(**restored.checkpoint_items()).restore(path)
  np.testing.assert_array_equal(restored.recent, steps[-spikes.WINDOW:])
  assert restored.spike(np.array([5 * 1000.5 + 1]), 1) is not None
  assert len(guard_with([1.0, 2.0]).recent) == 2


def test_a_checkpoint_without_them_resumes_and_says_so(tmp_path, caplog):
  trainer = pieces.trainer(tiny.get_config())
  def checkpointer(items):
    return checkpoint.Checkpointer(workdir.Workdir(str(tmp_path)), items,
                                   keep=1, chief=True, task_id=0)
  prefix = checkpointer(trainer.checkpoint_items()).save(0, sync=True)
  guard = guard_with([])
  with caplog.at_level(logging.WARNING):
    assert checkpointer({**trainer.checkpoint_items(),
                         **guard.checkpoint_items()}).restore() == prefix
  assert [r.getMessage() for r in caplog.records
          if "written without" in r.getMessage()] == [
      f"{prefix} was written without the recent steps' losses"
      " train.spike_factor compares with, so spikes are looked for again"
      " after a few steps."]
  assert len(guard.recent) == 0


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """spiky run to its end in this process, and its logged lines."""
  workdir = tmp_path_factory.mktemp("spiky")
  lines = []
  handler = logging.Handler(logging.INFO)
  handler.emit = lambda record: lines.append(record.getMessage())
  logging.getLogger("absl").addHandler(handler)
  try:
    run_here(SPIKY, f"--workdir={workdir}")
  finally:
    logging.getLogger("absl").removeHandler(handler)
  return workdir, lines


@pytest.mark.slow  # two runs
def test_a_spike_rolls_back_and_the_run_ends_as_one_without_its_data(
    whole, tmp_path):
  workdir, lines = whole
  said = [l for l in lines if "spiked" in l]
  assert len(said) == 1, lines
  assert said[0].startswith("train loss spiked to ")
  assert (f"at step {spiky.SPIKE_STEP}, above train.spike_factor=5 x " in
          said[0])
  assert said[0].endswith(
      f"; restored {workdir}/checkpoints/ckpt-20 (step 20) and skipped the"
      f" data up to global example {spiky.SKIPPED[1]} (recovery 1 of"
      " train.nan_recovery_tries=1)")
  # The line explaining the roll-back comes before the re-save it causes.
  saved = f"Saved {workdir}/checkpoints/ckpt-"
  assert [l for l in lines if l.startswith(saved) or l in said] == [
      saved + "20", said[0], saved + "20", saved + "40", saved + "60"]
  cut = tmp_path / "cut"
  run_here(SPIKY, f"--workdir={cut}", f"--config.model.cut={spiky.SKIPPED}")
  np.testing.assert_array_equal(curve(workdir / "train"), curve(cut / "train"))
  want = checkpoint_tensors(cut / "checkpoints" / "ckpt-60")
  got = checkpoint_tensors(workdir / "checkpoints" / "ckpt-60")
  assert sorted(got) == sorted(want)
  position = [k for k in got if k.startswith("position/")]
  for key in got:
    if key not in position:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  skipped = spiky.SKIPPED[1] - spiky.SKIPPED[0]
  assert [got[k] - want[k] for k in position] == [skipped]


@pytest.mark.slow  # two runs
def test_ended_before_the_spike_the_resumed_run_rolls_it_back_the_same(
    whole, tmp_path):
  workdir, _ = whole
  with pytest.raises(spiky.Interrupted):
    run_here(SPIKY, f"--workdir={tmp_path}", "--config.model.stop_at=30")
  assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.index")
                ) == ["ckpt-20.index"]
  run_here(SPIKY, f"--workdir={tmp_path}")
  np.testing.assert_array_equal(curve(tmp_path / "train"),
                                curve(workdir / "train"))
  want = checkpoint_tensors(workdir / "checkpoints" / "ckpt-60")
  got = checkpoint_tensors(tmp_path / "checkpoints" / "ckpt-60")
  assert sorted(got) == sorted(want)
  for key in want:  # the recent losses too
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.slow  # a run
def test_off_the_run_trains_through_the_spike_and_saves_no_losses(tmp_path):
  run_here(SPIKY, f"--workdir={tmp_path}", "--config.train.spike_factor=0.0")
  losses = curve(tmp_path / "train")
  assert len(losses) == 60
  assert losses[spiky.SPIKE_STEP - 1] > 5 * np.median(losses[:30])
  assert not [k for k in checkpoint_tensors(tmp_path / "checkpoints" /
                                            "ckpt-60")
              if k.startswith("recent_losses")]
