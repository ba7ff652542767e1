"""The profiler window against the fake Controller: where loops end, when
the trace starts and stops (no TensorFlow; the real trace is in
test_tensorboard.py), and its config fields."""

import pytest

from looper import config as lc
from looper import workdir
from looper.control import actions
from looper.control import profiler
from tests.fixtures import tiny
from tests.unit.control.test_controller import make


def window(log, trainer_of, logdir="/logs", start_step=10, num_steps=5):
  """A Window whose profiler records ('start' | 'stop', global step); it
  traces into workdir `logdir` (None: none, a non-chief)."""
  return profiler.Window(
      logdir and workdir.Workdir(logdir), start_step=start_step,
      num_steps=num_steps,
      start=lambda d: log.append(("start", trainer_of().global_step, d)),
      stop=lambda: log.append(("stop", trainer_of().global_step)))


def loop_ends(trainer):
  return [first + n - 1 for first, n in trainer.loops]


def fake_run(total=40, start_step=0, logdir="/logs", **kwargs):
  """Trains a fake run from `start_step` with a window on steps 11-15."""
  log = []
  ctl, trainer, _ = make(total=total, steps_per_loop=7, save_actions=[
      window(log, lambda: trainer, logdir)], **kwargs)
  trainer.global_step = start_step
  return ctl, trainer, log


def test_loops_end_on_the_window_and_it_traces_only_its_steps():
  ctl, trainer, log = fake_run()
  ctl.train()
  # Inside the window, one step per loop (a step marker each).
  assert loop_ends(trainer) == [7, 10, 11, 12, 13, 14, 15, 22, 29, 36, 40]
  assert log == [("start", 10, "/logs/train"), ("stop", 15)]


def test_a_run_resumed_inside_the_window_traces_the_rest():
  ctl, trainer, log = fake_run(start_step=12)
  ctl.train()
  assert loop_ends(trainer)[:4] == [13, 14, 15, 22]
  assert log == [("start", 12, "/logs/train"), ("stop", 15)]


def test_a_run_resumed_past_the_window_does_not_trace():
  ctl, trainer, log = fake_run(start_step=15)
  ctl.train()
  assert loop_ends(trainer) == [22, 29, 36, 40] and log == []


def test_the_end_or_a_signal_inside_the_window_stops_the_trace():
  ctl, _, log = fake_run(total=13)
  ctl.train()
  assert log == [("start", 10, "/logs/train"), ("stop", 13)]
  ctl, trainer, log = fake_run()
  original = trainer.train

  def train(steps):  # SIGTERM during the window's second step
    if trainer.global_step == 11:
      trainer.stop.request("SIGTERM")
      trainer.stop_after(1)
    return original(steps)

  trainer.train = train
  assert ctl.train()["stopped"] == "SIGTERM"
  assert log == [("start", 10, "/logs/train"), ("stop", 12)]


def test_training_ending_at_the_start_step_starts_no_trace():
  early_stop = actions.Action(
      lambda now: now.step == 10 and now.end_training("early stop"),
      every_steps=5)
  ctl, trainer, log = fake_run(eval_actions=[early_stop])
  assert ctl.train_and_eval()["step"] == 10
  assert log == []


def test_without_a_logdir_loops_still_end_on_the_window():
  # A non-chief worker: no trace, but its loops must match the chief's.
  ctl, trainer, log = fake_run(logdir=None)
  ctl.train()
  assert loop_ends(trainer) == [7, 10, 11, 12, 13, 14, 15, 22, 29, 36,
                                40] and log == []


@pytest.mark.parametrize("fields, message", [
    ({"start_step": -1}, "config.profile.start_step=-1: must be a whole number"
     " >= 0; set --config.profile.start_step"),
    ({"start_step": 40}, "config.profile.start_step=40: must be <"
     " train.steps=40: the trace holds the steps after it; set"
     " --config.profile.start_step"),
    ({"start_step": 10, "num_steps": 0}, "config.profile.num_steps=0: must be"
     " a whole number >= 1; set --config.profile.num_steps"),
])
def test_bad_profile_fields_are_one_line(fields, message):
  c = tiny.get_config()
  c.profile.update(fields)
  with pytest.raises(lc.ConfigError) as e:
    lc.validate(c)
  assert str(e.value) == message
