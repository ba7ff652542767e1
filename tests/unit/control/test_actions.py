"""Actions get what they need as arguments (a Moment) and return results.

Against the fake trainer of test_controller.py: no TensorFlow. Each test
states by hand what an action must see at each step and what the mode
returns.
"""

import ml_collections
import pytest

from looper import errors
from looper import fields
from looper.control import actions
from tests.unit.control.test_controller import make


def seen(log, name, *fields):
  """An action fn that records (name, step, *fields of the Moment)."""
  return lambda now: log.append(
      (name, now.step, *(getattr(now, f) for f in fields)))


def test_a_save_action_is_told_when_it_saves_for_a_stop():
  log = []
  save = actions.Action(seen(log, "save", "stopping", "stopped", "end"),
                        every_steps=10, at_end=True, on_stop=True)
  ctl, trainer, _ = make(total=40, steps_per_loop=10, save_actions=[save])
  original = trainer.train

  def train(steps):
    if trainer.global_step == 20:  # SIGTERM 4 steps into the third loop
      trainer.stop.request("SIGTERM")
      trainer.stop_after(4)
    return original(steps)

  trainer.train = train
  result = ctl.train()
  assert log == [("save", 10, False, None, False),
                 ("save", 20, False, None, False),
                 ("save", 24, True, "SIGTERM", False)]
  assert result["stopped"] == "SIGTERM" and result["step"] == 24


def test_what_an_action_returns_is_the_result_under_its_name():
  # An export at the end returns its path; a save returns nothing.
  export = actions.Action(lambda now: f"/w/export/{now.step}", at_end=True,
                          name="export")
  evaluate = actions.Action(lambda now: {"loss": 1 / now.step},
                            every_steps=15, at_end=True, name="eval")
  save = actions.Action(lambda now: None, every_steps=10, name="checkpoint")
  ctl, _, _ = make(total=40, steps_per_loop=10, eval_actions=[evaluate],
                   save_actions=[save, export])
  result = ctl.train_and_eval()
  assert result["export"] == "/w/export/40"
  assert result["eval"] == {"loss": 1 / 40}  # the last evaluation's
  assert "checkpoint" not in result
  assert ctl.train_and_eval() == {"step": 40}  # nothing left to run


def test_an_early_end_is_seen_by_the_actions_after_it_in_that_loop():
  log = []

  def evaluate(now):
    log.append(("eval", now.step, now.end))
    if now.step == 20:
      now.end_training("early stop at step 20")

  save = actions.Action(seen(log, "save", "end", "ended"), at_end=True)
  ctl, trainer, _ = make(total=40, steps_per_loop=10,
                         eval_actions=[actions.Action(evaluate,
                                                      every_steps=10)],
                         save_actions=[save])
  result = ctl.train_and_eval()
  assert log == [("eval", 10, False), ("eval", 20, False),
                 ("save", 20, True, "early stop at step 20")]
  assert result["ended"] == "early stop at step 20"
  assert trainer.global_step == 20


def test_on_start_gets_the_moment_and_may_end_training_before_a_step():
  started = []

  def resume(now):  # patience already ran out in the run resumed
    started.append((now.step, now.loop, now.end))
    now.end_training("early stop at step 30")

  save = actions.Action(lambda now: None, at_end=True, on_start=resume)
  ctl, trainer, _ = make(total=40, save_actions=[save])
  trainer.global_step = 30
  result = ctl.train()
  assert started == [(30, None, False)]
  assert trainer.loops == [] and result == {"step": 30,
                                            "ended": "early stop at step 30"}


def test_each_action_gets_the_loop_it_follows():
  loops = []
  report = actions.Action(
      lambda now: loops.append((now.loop.first_step, now.loop.last_step,
                                now.loop.logs["loss"])), every_loop=True)
  ctl, _, _ = make(total=12, steps_per_loop=5, report_actions=[report])
  ctl.train()
  # The fake's loss of step s is 1/s: a loop's loss is their mean.
  assert loops == [(1, 5, sum(1 / s for s in range(1, 6)) / 5),
                   (6, 10, sum(1 / s for s in range(6, 11)) / 5),
                   (11, 12, (1 / 11 + 1 / 12) / 2)]


def test_an_action_gets_the_model_and_the_writer_not_the_trainer():
  """What a user's action reaches: the run's model and writers, given to
  the Controller (looper.run.runner), and no Trainer."""
  model, writer, log = object(), object(), []
  act = actions.Action(seen(log, "mine", "model", "writer"), every_steps=10)
  ctl, _, _ = make(total=20, steps_per_loop=10, save_actions=[act],
                   model=model, writer=writer)
  ctl.train()
  assert log == [("mine", 10, model, writer), ("mine", 20, model, writer)]
  assert not hasattr(actions.Moment(0, 20), "trainer")


@pytest.mark.parametrize("chief", [True, False])
def test_a_user_action_runs_on_the_chief_and_every_worker_keeps_its_trigger(
    chief):
  log, agreed, writer = [], [], object()

  def agree(flag):  # a collective: every worker must call it alike
    agreed.append(flag)
    return flag

  mine = actions.Action(seen(log, "mine", "writer"), every_steps=10,
                        every_secs=1e9,
                        on_start=lambda now: log.append(("start", now.step)))
  everyone = actions.Action(seen(log, "everyone", "chief"), every_steps=20,
                            all_workers=True)
  ctl, trainer, _ = make(total=40, steps_per_loop=10, chief=chief,
                         writer=writer, save_actions=[mine, everyone])
  trainer.stop.agree = agree
  ctl.train()
  ran_here = [("start", 0), ("mine", 10, writer), ("mine", 20, writer),
              ("mine", 30, writer), ("mine", 40, writer)] if chief else []
  assert log == ran_here[:3] + [("everyone", 20, chief)] + ran_here[3:] + [
      ("everyone", 40, chief)]
  assert agreed == [False] * 4  # every_secs asked after each loop, anywhere


def test_config_actions_are_a_list_or_a_factory_of_one():
  action = actions.Action(lambda now: None, every_steps=5)
  config = ml_collections.ConfigDict(
      {"actions": fields.object_field((action,)), "width": 3})
  assert actions.of_config(config) == [action]
  config.actions = lambda c: [action] * c.width
  assert actions.of_config(config) == [action] * 3
  config.actions = "tests.unit.control.test_actions:_two_actions"
  assert [a.every_steps for a in actions.of_config(config)] == [3, 3]
  for bad in (action, [print], "tests.unit.control.test_actions:nothing"):
    config.actions = bad
    with pytest.raises(errors.ConfigError, match=r"^config\.actions=") as e:
      actions.of_config(config)
    assert "\n" not in str(e.value)


def test_an_action_without_a_trigger_is_refused_in_one_line():
  def log_samples(now):
    del now
  for trigger in (dict(every_steps=5), dict(every_secs=1.0),
                  dict(every_loop=True), dict(at_end=True),
                  dict(on_stop=True)):
    assert actions.Action(log_samples, **trigger).name == "log_samples"
  with pytest.raises(errors.ConfigError) as e:
    actions.Action(log_samples, every_steps=0, all_workers=True)
  assert str(e.value) == (
      "looper.Action(log_samples) has no trigger, so it would never run;"
      " give it every_steps=N, every_secs=S, every_loop=True, at_end=True or"
      " on_stop=True")


def _two_actions(config):
  return [actions.Action(lambda now: None, every_steps=config.width)] * 2
