"""A sweep's space and objective: each bad input is one line naming the fix."""

import optuna
import pytest

from looper import sweep
from looper.errors import ConfigError
from looper.sweep import space
from tests.fixtures import tiny_sweep


def check(space_, objective="eval/accuracy", direction="maximize"):
  return space.check(sweep.Sweep(space_, objective, direction),
                     tiny_sweep.get_config())


def test_a_space_of_looper_and_optuna_distributions_is_json():
  got = check({"optimizer.learning_rate": sweep.Float(1e-4, 1.0, log=True),
               "model.width": optuna.distributions.IntDistribution(4, 32,
                                                                   step=4),
               "optimizer.name": sweep.Categorical(("sgd", "adam"))})
  assert got == {
      "space": {
          "optimizer.learning_rate": {"type": "float", "low": 1e-4,
                                      "high": 1.0, "log": True,
                                      "step": None},
          "model.width": {"type": "int", "low": 4, "high": 32, "log": False,
                          "step": 4},
          "optimizer.name": {"type": "categorical",
                             "choices": ["sgd", "adam"]}},
      "objective": "eval/accuracy", "direction": "maximize"}


@pytest.mark.parametrize("space_, message", [
    ({"optimizer.learnig_rate": sweep.Float(0.1, 1)},
     "get_sweep: space key 'optimizer.learnig_rate' is no config field; did"
     " you mean 'optimizer.learning_rate'?"),
    ({"optimizer": sweep.Float(0.1, 1)},
     "get_sweep: space key 'optimizer' is a block of the config; name one of"
     " its fields"),
    ({"optimizer.learning_rate": sweep.Float(0.1, 0.1)},
     "get_sweep: space['optimizer.learning_rate'] range [0.1, 0.1] is empty;"
     " give low < high"),
    ({"optimizer.learning_rate": sweep.Float(1, 0.1)},
     "get_sweep: space['optimizer.learning_rate'] range [1, 0.1] is"
     " inverted; give low < high"),
    ({"optimizer.learning_rate": sweep.Float(0, 1, log=True)},
     "get_sweep: space['optimizer.learning_rate'] is log-scaled from 0; a log"
     " scale needs low > 0 (e.g. 1e-5)"),
    ({"optimizer.name": sweep.Categorical(())},
     "get_sweep: space['optimizer.name'] has no choices; give at least two"),
    ({"model.width": sweep.Float(4, 32)},
     "get_sweep: space['model.width'] samples floats for an int field"
     " (model.width=16); use looper.sweep.Int"),
    ({"model.width": (4, 32)},
     "get_sweep: space['model.width'] is (4, 32); use looper.sweep.Float,"
     " Int or Categorical (or an Optuna distribution)"),
    ({}, "get_sweep: the space is empty; map at least one config field to a"
     " distribution"),
])
def test_a_bad_space_is_one_line(space_, message):
  with pytest.raises(ConfigError) as e:
    check(space_)
  assert str(e.value) == message


def test_a_bad_objective_or_direction_is_one_line():
  width = {"model.width": sweep.Int(4, 32)}
  with pytest.raises(ConfigError, match=r"^get_sweep: direction='max'; use"
                     r" 'maximize' or 'minimize'$"):
    check(width, direction="max")
  with pytest.raises(ConfigError, match=r"^get_sweep: objective=''; name an"
                     r" eval metric, e.g. 'eval/accuracy'$"):
    check(width, objective="")


def test_the_objective_names_a_key_of_the_eval_lines():
  assert space.metric_key("eval/accuracy") == "accuracy"
  assert space.metric_key("val/loss") == "val/loss"


def test_overrides_of_swept_fields_and_sampled_values_as_flags():
  swept = {"model.width": {}}
  assert space.swept_overrides(swept, ["--config.model.width=8",
                                       "--config.train.steps=9"]) == [
                                           "--config.model.width=8"]
  assert space.override("optimizer.learning_rate", 0.1 + 0.2) == (
      "--config.optimizer.learning_rate=0.30000000000000004")
  assert space.override("optimizer.name", "adam") == (
      "--config.optimizer.name=adam")
