"""config.trackers: its names (and trackers_group's), one line each for a
typo or a tracker not installed, before anything is written; the config as
params."""

import importlib.util
import json

import pytest
import tensorflow as tf

from looper import errors
from looper import run
from looper import trackers
from tests.fixtures import catalogue
from tests.fixtures import needs
from tests.fixtures import tiny
from tests.fixtures.configs import configured


def test_the_names_config_trackers_holds():
  assert trackers.parse("") == []
  assert trackers.parse(" mlflow , wandb") == ["mlflow", "wandb"]
  for value, line in [
      ("mlfow", "config.trackers='mlfow': 'mlfow' is not one of mlflow, wandb;"
                " did you mean 'mlflow'? set --config.trackers (comma"
                " separated, '' for none)"),
      ("wandb,wandb", "config.trackers='wandb,wandb' names a tracker twice;"
                      " name each once")]:
    with pytest.raises(errors.ConfigError) as e:
      trackers.parse(value)
    assert str(e.value) == line
  # The group's name (a sweep's study) is checked with them.
  assert trackers.check("mlflow", "mnist-lr") == ["mlflow"]
  for group in ("it's", "a\nb", "x" * 129):
    with pytest.raises(errors.ConfigError) as e:
      trackers.check("mlflow", group)
    assert str(e.value) == (
        f"config.trackers_group={group!r}: a group's name is one line of at"
        " most 128 characters without quotes; set --config.trackers_group"
        " (a sweep: --study)")


@pytest.mark.parametrize("value, line, store", [
    ("mlflow,tensorbored", "config.trackers='mlflow,tensorbored':"
                           " 'tensorbored' is not one of", None),
    ("wandb", catalogue.line("tracker-not-installed"), None),
    ("mlflow", catalogue.line("mlflow-store-on-object-store",
                              workdir="ram://trackers/run"),
     "ram://trackers")], ids=["unknown", "not-installed", "object-store"])
def test_a_bad_tracker_is_one_line_before_anything_is_written(
    tmp_path, monkeypatch, value, line, store):
  if store:
    needs.extra("mlflow", "mlflow")
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if
                      name == "wandb" else find_spec(name, *a))
  monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
  workdir = f"{store or tmp_path}/run"
  with pytest.raises(errors.ConfigError, match=line):
    run.Run(configured(tiny.get_config(), trackers=value), workdir, "train")
  assert not tf.io.gfile.exists(workdir)


def test_the_resolved_config_as_params_every_field_by_its_dotted_name():
  config = json.dumps({"train": {"steps": 40, "precision": "float32",
                                 "metrics": ["accuracy"]},
                       "model": {}, "eval": {"steps": None}, "seed": 0})
  assert trackers.params(config) == {
      "train.steps": "40", "train.precision": "float32",
      "train.metrics": '["accuracy"]', "model": "{}", "eval.steps": "null",
      "seed": "0"}
