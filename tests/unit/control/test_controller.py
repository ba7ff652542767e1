"""The Controller and its actions against a fake trainer: no TensorFlow.

Each test states the expected steps by hand: where loops end, when an
action fires, what a stop, an early end or a NaN roll-back does.
"""

import numpy as np
import pytest

from looper.data import batch as batch_lib
from looper.control import actions
from looper.control import controller as controller_lib


class FakeTrainer:
  """Steps are numbered; the loss of step s is 1/s (NaN at `nan_steps`).
  It is the Controller's data too (`data_position`, `seek`)."""
  global_batch_size = 4

  def __init__(self, clock=None, secs_per_step=0.0, nan_steps=()):
    self.global_step = 0
    self.stop = FakeStop(self)
    self.data_position = 0
    self.loops = []  # (first step, steps run)
    self.seeks = []
    self._stop_after = None
    self._clock, self._secs = clock, secs_per_step
    self.nan_steps = set(nan_steps)

  def train(self, steps):
    if self._stop_after is not None:
      steps = min(steps, self._stop_after)
      self._stop_after = 0
    first = self.global_step + 1
    self.loops.append((first, steps))
    losses = np.array([np.nan if s in self.nan_steps else 1.0 / s
                       for s in range(first, first + steps)])
    self.global_step += steps
    self.data_position += steps * self.global_batch_size
    if self._clock:
      self._clock.now += steps * self._secs
    return {"loss": losses}, {"accuracy": 0.5}

  def learning_rate(self):
    return 0.1

  weights_finite = True

  def stop_after(self, steps):
    """The next loop stops after `steps` steps (a signal mid-loop)."""
    self._stop_after = steps

  def seek(self, position=None):
    self.seeks.append(position)
    if position is not None:
      self.data_position = position


class FakeStop:
  """The trainer's stop request: the running loop ends at once."""
  agree = staticmethod(bool)

  def __init__(self, trainer):
    self._trainer = trainer
    self.requested, self.reason = False, None

  def request(self, reason):
    self._trainer._stop_after = 0  # pylint: disable=protected-access
    self.requested, self.reason = True, reason


class FakeCheckpointer:
  directory = "/fake/checkpoints"

  def __init__(self, trainer):
    self.trainer, self.saved, self.restored = trainer, {}, []

  def save(self, step, sync=False, force=False):
    self.saved[step] = (self.trainer.data_position, sync)

  def latest(self):
    return f"ckpt-{max(self.saved)}" if self.saved else None

  def all(self):
    return [f"ckpt-{s}" for s in sorted(self.saved)]

  def restore(self, path=None):
    if not self.saved:
      return None
    step = int(path.split("-")[1]) if path else max(self.saved)
    self.trainer.global_step = step
    self.trainer.data_position = self.saved[step][0]
    self.restored.append(step)
    return f"ckpt-{step}"


class Clock:
  now = 0.0

  def __call__(self):
    return self.now


def recorder(log, name):
  return lambda now: log.append((name, now.step))


def make(total=40, steps_per_loop=7, trainer=None, **kwargs):
  trainer = trainer or FakeTrainer()
  ckpt = FakeCheckpointer(trainer)
  ctl = controller_lib.Controller(
      trainer, ckpt, data=trainer, batch=batch_lib.Batch(
          micro_batch_size=trainer.global_batch_size, replicas=1),
      total_steps=total, steps_per_loop=steps_per_loop, **kwargs)
  return ctl, trainer, ckpt


def test_loop_length():
  assert controller_lib.loop_length(0, 40, 7, [20, 15]) == 7
  assert controller_lib.loop_length(14, 40, 7, [20, 15]) == 1
  assert controller_lib.loop_length(37, 40, 7, [None]) == 3


def test_step_actions_land_exactly_and_fire_at_the_end():
  log = []
  evaluate = actions.Action(recorder(log, "eval"), every_steps=20,
                            at_end=True)
  save = actions.Action(recorder(log, "save"), every_steps=15, at_end=True)
  report = actions.Action(recorder(log, "report"), every_loop=True)
  ctl, trainer, _ = make(report_actions=[report], eval_actions=[evaluate],
                         save_actions=[save])
  result = ctl.train_and_eval()
  assert [f + n - 1 for f, n in trainer.loops] == [7, 14, 15, 20, 27, 30, 37,
                                                    40]
  assert [s for n, s in log if n == "eval"] == [20, 40]
  assert [s for n, s in log if n == "save"] == [15, 30, 40]
  assert [s for n, s in log if n == "report"] == [7, 14, 15, 20, 27, 30, 37,
                                                  40]
  # Order after a loop: report, then eval, then save.
  assert log[-3:] == [("report", 40), ("eval", 40), ("save", 40)]
  assert result["step"] == 40 and result["train"]["loss"] == pytest.approx(
      np.mean([1 / s for s in (38, 39, 40)]))


def test_train_mode_skips_eval_actions():
  log = []
  ctl, _, _ = make(eval_actions=[actions.Action(recorder(log, "eval"),
                                                every_steps=10, at_end=True)])
  ctl.train()
  assert log == []


def test_every_secs_with_an_injected_clock():
  clock = Clock()
  trainer = FakeTrainer(clock=clock, secs_per_step=1.0)
  log = []
  save = actions.Action(recorder(log, "save"), every_secs=25, clock=clock)
  ctl, trainer, _ = make(total=70, steps_per_loop=10, trainer=trainer,
                         save_actions=[save], clock=clock)
  ctl.train()
  # 10 s a loop: 30 s have passed at step 30, 60 s at 60 (30 after it).
  assert log == [("save", 30), ("save", 60)]


def test_a_signal_mid_loop_saves_at_the_step_reached_and_skips_eval():
  log = []
  trainer = FakeTrainer()
  evaluate = actions.Action(recorder(log, "eval"), every_steps=20,
                            at_end=True)
  report = actions.Action(recorder(log, "report"), every_loop=True)
  save = actions.Action(recorder(log, "save"), every_steps=20, at_end=True,
                        on_stop=True)
  ctl, trainer, _ = make(steps_per_loop=10, trainer=trainer,
                         report_actions=[report], eval_actions=[evaluate],
                         save_actions=[save])
  original = trainer.train

  def train(steps):
    if trainer.global_step == 20:  # the signal comes 3 steps into step 21
      trainer.stop.request("SIGTERM")
      trainer.stop_after(3)
    return original(steps)

  trainer.train = train
  result = ctl.train_and_eval()
  assert result["step"] == 23 and result["stopped"] == "SIGTERM"
  assert log == [("report", 10), ("report", 20), ("eval", 20), ("save", 20),
                 ("report", 23), ("save", 23)]


def test_a_signal_between_loops_saves_once():
  log = []
  save = actions.Action(recorder(log, "save"), every_steps=20, at_end=True,
                        on_stop=True)
  report = actions.Action(recorder(log, "report"), every_loop=True)
  ctl, trainer, _ = make(steps_per_loop=10, report_actions=[report],
                         save_actions=[save])
  report.fn = lambda now: (log.append(("report", now.step)),
                           now.step == 10 and trainer.stop.request("SIGINT"))
  result = ctl.train()
  # The next loop runs no step: nothing to report, one save at step 10.
  assert log == [("report", 10), ("save", 10)]
  assert result["stopped"] == "SIGINT" and trainer.global_step == 10


def test_end_training_from_an_eval_action_saves_that_step():
  log = []

  def evaluate(now):
    log.append(("eval", now.step))
    if now.step == 20:
      now.end_training("early stop")

  save = actions.Action(recorder(log, "save"), every_steps=15, at_end=True)
  ctl, trainer, _ = make(eval_actions=[actions.Action(evaluate,
                                                      every_steps=10)],
                         save_actions=[save])
  result = ctl.train_and_eval()
  assert log == [("eval", 10), ("save", 15), ("eval", 20), ("save", 20)]
  assert result["ended"] == "early stop" and trainer.global_step == 20


def test_nan_loss_raises_naming_step_and_kept_checkpoint():
  save = actions.Action(lambda now: ckpt.save(now.step), every_steps=10)
  ctl, trainer, ckpt = make(steps_per_loop=5,
                            trainer=FakeTrainer(nan_steps={23}),
                            save_actions=[save])
  with pytest.raises(FloatingPointError) as e:
    ctl.train()
  assert str(e.value) == (
      "train loss is nan at step 23; ckpt-20 is kept; lower"
      " --config.optimizer.learning_rate or check the data, or set"
      " --config.train.nan_recovery_tries=1 to roll back to it and skip this"
      " loop's data")
  assert sorted(ckpt.saved) == [10, 20]


def test_nan_recovery_rolls_back_and_skips_the_window():
  log = []
  save = actions.Action(lambda now: ckpt.save(now.step), every_steps=10,
                        at_end=True)
  resumed = []
  report = actions.Action(recorder(log, "report"), every_loop=True,
                          on_start=lambda now: resumed.append(now.step))
  trainer = FakeTrainer(nan_steps={23})
  ctl, trainer, ckpt = make(steps_per_loop=5, trainer=trainer,
                            report_actions=[report], save_actions=[save],
                            nan_recovery_tries=1)
  original = trainer.train

  def train(steps):  # the bad data is consumed once: the replay is clean
    values, logs = original(steps)
    if np.isnan(values["loss"]).any():
      trainer.nan_steps.clear()
    return values, logs

  trainer.train = train
  result = ctl.train()
  # Loop 21..25 blew up: back to ckpt-20 (position 80), data skipped to
  # position 100 (after the bad loop), steps 21..40 trained again.
  assert ckpt.restored == [20] and trainer.seeks == [100]
  assert resumed == [0, 20]
  assert [s for _, s in log] == [5, 10, 15, 20, 25, 30, 35, 40]
  assert result["step"] == 40
  assert trainer.data_position == 100 + 20 * 4


def test_nan_recovery_gives_up_after_its_tries():
  save = actions.Action(lambda now: ckpt.save(now.step), every_steps=10)
  # The fake's bad step stays bad: the replay after the roll-back blows up.
  ctl, _, ckpt = make(steps_per_loop=5, trainer=FakeTrainer(
      nan_steps={23}), save_actions=[save], nan_recovery_tries=1)
  with pytest.raises(FloatingPointError,
                     match=r"^train loss is nan at step 23 after 1 recoveries"
                     r" \(train.nan_recovery_tries\); ckpt-20 is kept"):
    ctl.train()


class FakeSpikes:
  """The loop holding step `at` spikes `times` times (the replays after a
  roll-back see other data, so the next one does not); the loops kept, by
  their last step."""

  def __init__(self, trainer, at, times=1):
    self.trainer, self.at, self.left, self.kept = trainer, at, times, []

  def spike(self, losses, first_step):
    if self.left and first_step <= self.at < first_step + len(losses):
      self.left -= 1
      return f"train loss spiked at step {self.at}"
    return None

  def add(self, losses):
    self.kept.append(self.trainer.global_step)


def test_a_spike_rolls_back_like_a_nan_in_one_line(caplog):
  trainer = FakeTrainer()
  spikes = FakeSpikes(trainer, at=23)
  saves = []  # the loops kept when each save was made
  save = actions.Action(lambda now: (ckpt.save(now.step), saves.append(
      list(spikes.kept))), every_steps=10)
  ctl, trainer, ckpt = make(steps_per_loop=5, trainer=trainer,
                            save_actions=[save], nan_recovery_tries=1,
                            spikes=spikes)
  with caplog.at_level("WARNING", logger="absl"):
    result = ctl.train()
  assert ckpt.restored == [20] and trainer.seeks == [100]
  assert result["step"] == 40 and trainer.data_position == 100 + 20 * 4
  # Loop 21..25 was not kept; each save holds the loops before it.
  assert spikes.kept == [5, 10, 15, 20, 25, 30, 35, 40]
  assert saves[1] == [5, 10, 15, 20] and saves[-1] == spikes.kept
  assert [r.getMessage() for r in caplog.records] == [
      "train loss spiked at step 23; restored ckpt-20 (step 20) and skipped"
      " the data up to global example 100 (recovery 1 of"
      " train.nan_recovery_tries=1)"]


@pytest.mark.parametrize("tries,message", [
    # None left: the roll-back's replay spiked again.
    (1, "train loss spiked at step 23 after 1 recoveries"
        " (train.nan_recovery_tries); ckpt-20 is kept; lower"
        " --config.optimizer.learning_rate or check the data, or raise"
        " --config.train.spike_factor"),
    # None given: the line names them.
    (0, "train loss spiked at step 23; ckpt-20 is kept; lower"
        " --config.optimizer.learning_rate or check the data, or raise"
        " --config.train.spike_factor, or set"
        " --config.train.nan_recovery_tries=1 to roll back to it and skip"
        " this loop's data"),
], ids=["none-left", "none-given"])
def test_a_spike_without_tries_stops_naming_the_factor_and_tries(tries,
                                                                 message):
  trainer = FakeTrainer()
  save = actions.Action(lambda now: ckpt.save(now.step), every_steps=10)
  ctl, _, ckpt = make(steps_per_loop=5, trainer=trainer, save_actions=[save],
                      nan_recovery_tries=tries,
                      spikes=FakeSpikes(trainer, at=23, times=2))
  with pytest.raises(FloatingPointError) as e:
    ctl.train()
  assert str(e.value) == message
  assert ckpt.restored == [20] * tries and sorted(ckpt.saved) == [10, 20]


def test_continuous_eval_evaluates_each_checkpoint_once():
  trainer = FakeTrainer()
  evaluated = []

  def evaluate(step):
    evaluated.append(step)
    return {"loss": 1.0 / step}

  ctl, trainer, ckpt = make(total=30)
  ckpt.save(10)
  arrivals = iter([[], [20], [], [25, 30]])  # what training writes meanwhile

  def sleep(secs):
    for step in next(arrivals):
      ckpt.save(step)

  result = ctl.continuous_eval(evaluate, timeout_secs=10, sleep=sleep)
  assert evaluated == [10, 20, 25, 30]
  assert result["evaluated"] == [10, 20, 25, 30] and result["step"] == 30


def test_continuous_eval_times_out_without_new_checkpoints():
  ctl, _, ckpt = make(total=30)
  ckpt.save(10)
  sleeps = []
  result = ctl.continuous_eval(lambda step: {}, timeout_secs=3, poll_secs=1,
                               sleep=sleeps.append)
  assert result["evaluated"] == [10] and len(sleeps) == 3


def test_action_rejects_negative_intervals():
  with pytest.raises(ValueError, match="must be >= 0"):
    actions.Action(print, every_steps=-1)


def test_a_signal_during_the_last_step_still_ends_normally():
  log = []
  evaluate = actions.Action(recorder(log, "eval"), every_steps=20,
                            at_end=True)
  save = actions.Action(recorder(log, "save"), at_end=True, on_stop=True)
  ctl, trainer, _ = make(total=20, steps_per_loop=10, eval_actions=[evaluate],
                         save_actions=[save])
  original = trainer.train

  def train(steps):
    if trainer.global_step == 10:  # the signal comes during the last loop
      trainer.stop.request("SIGTERM")
      trainer.stop_after(10)
    return original(steps)

  trainer.train = train
  result = ctl.train_and_eval()
  assert log == [("eval", 20), ("save", 20)] and "stopped" not in result


def test_non_finite_weights_after_finite_losses_stop_before_saving():
  save = actions.Action(lambda now: ckpt.save(now.step), every_steps=10,
                        at_end=True)
  ctl, trainer, ckpt = make(steps_per_loop=10, save_actions=[save])
  original = trainer.train

  def train(steps):
    out = original(steps)
    trainer.weights_finite = trainer.global_step < 20
    return out

  trainer.train = train
  with pytest.raises(FloatingPointError) as e:
    ctl.train()
  assert str(e.value) == (
      "the weights are not finite after step 20; ckpt-10 is kept; lower"
      " --config.optimizer.learning_rate or check the data, or set"
      " --config.train.nan_recovery_tries=1 to roll back to it and skip this"
      " loop's data")
  assert sorted(ckpt.saved) == [10]


def test_every_secs_asks_all_workers():
  asked = []

  def agree(flag):  # another worker's clock ran out, this one's did not
    asked.append(flag)
    return True

  clock = Clock()
  fired = []
  action = actions.Action(fired.append, every_secs=100, clock=clock)
  action.start(actions.Moment(0, 40))
  action(actions.Moment(10, 40, agree=agree))
  assert asked == [False] and [now.step for now in fired] == [10]
