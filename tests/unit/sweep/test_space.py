"""A sweep's space and objective: each bad input is one line naming the fix."""

import re
import subprocess
import sys

import optuna
import pytest

from looper import sweep
from looper.cli import sweep_spec
from looper.errors import ConfigError
from looper.sweep import space
from looper.sweep import spec
from tests.fixtures import catalogue
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


def said(error) -> str:
  """What `looper sweep` prints for `error` (looper.cli.sweep.main)."""
  return f"looper sweep: {error.value}"


@pytest.mark.parametrize("space_, want", [
    ({"qqqq": sweep.Float(0.1, 1)},
     catalogue.line("sweep-key-unknown-far", key="qqqq")),
    ({"optimizer": sweep.Float(0.1, 1)},
     catalogue.line("sweep-key-block", key="optimizer")),
    ({"optimizer.learning_rate": sweep.Float(0.1, 0.1)},
     catalogue.line("sweep-range-empty", key="optimizer.learning_rate",
                    low=0.1, high=0.1)),
    ({"optimizer.learning_rate": sweep.Float(1, 0.1)},
     catalogue.line("sweep-range-inverted", key="optimizer.learning_rate",
                    low=1, high=0.1)),
    ({"optimizer.learning_rate": sweep.Float(0, 1, log=True)},
     catalogue.line("sweep-log-from-zero", key="optimizer.learning_rate",
                    low=0)),
    ({"optimizer.learning_rate": sweep.Float(1e-3, 1, log=True, step=0.1)},
     catalogue.line("sweep-log-and-step", key="optimizer.learning_rate")),
    ({"optimizer.name": sweep.Categorical(())},
     catalogue.line("sweep-no-choices", key="optimizer.name")),
    ({"model.width": sweep.Float(4, 32)},
     catalogue.line("sweep-float-for-int", key="model.width", value=16)),
    ({"model.width": (4, 32)},
     catalogue.line("sweep-not-a-distribution", key="model.width",
                    **{"what it is": (4, 32)})),
    ({}, catalogue.line("sweep-space-empty")),
], ids=["far", "block", "empty", "inverted", "log-0", "log-step", "choices",
        "float-int", "tuple", "no-space"])
def test_a_bad_space_is_one_line(space_, want):
  with pytest.raises(ConfigError) as e:
    check(space_)
  assert re.fullmatch(want, said(e)), said(e)


def test_a_bad_sweep_objective_or_direction_is_one_line():
  width = {"model.width": sweep.Int(4, 32)}
  with pytest.raises(ConfigError) as e:
    space.check({"space": width}, tiny_sweep.get_config())
  assert re.fullmatch(catalogue.line("sweep-not-a-sweep", type="dict"),
                      said(e))
  with pytest.raises(ConfigError) as e:
    check(width, direction="max")
  assert re.fullmatch(catalogue.line("sweep-direction", direction="'max'"),
                      said(e))
  with pytest.raises(ConfigError) as e:
    check(width, objective="")
  assert re.fullmatch(catalogue.line("sweep-objective-empty", objective="''"),
                      said(e))


def test_a_file_without_get_sweep_is_one_line(tmp_path):
  path = tmp_path / "exp.py"
  path.write_text("def get_config():\n  return None\n")
  with pytest.raises(ConfigError) as e:
    sweep_spec.load_sweep(str(path), None)
  assert re.fullmatch(catalogue.line("sweep-no-get-sweep", file=path),
                      said(e))


class _Dies:
  """A starter whose child dies as Python starts, without looper's line."""

  def start(self, argv, *, env, stdout, stderr):
    del argv
    with open(stdout, "w") as out, open(stderr, "w") as err:
      return subprocess.Popen(
          [sys.executable, "-c", "import sys; print('a\\nb\\nc\\nd',"
           " file=sys.stderr); sys.exit(3)"], env=env, stdout=out, stderr=err)


def test_a_child_that_dies_without_its_line_is_one_line(tmp_path):
  with pytest.raises(ConfigError) as e:
    spec.read("exp.py", [], _Dies(), str(tmp_path))
  assert re.fullmatch(catalogue.line(
      "sweep-spec-child-failed", file="exp.py", code=3,
      **{"its last 3 lines of stderr": "b | c | d"}), said(e)), said(e)
  assert not list(tmp_path.iterdir())  # its output files removed


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
