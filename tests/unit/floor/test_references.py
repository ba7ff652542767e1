"""looper.references: functions in a config written to config.json and loaded
back; a config file named by path runs once per process."""

import functools
import json

import keras
import numpy as np
import pytest

from looper import config as lc
from looper import references
from tests.fixtures import catalogue
from tests.fixtures import tiny
from tests.fixtures.paths import ROOT


# --- Losses that are not plain functions are written to config.json --------


def _module_level_loss(labels, logits):
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


def _saved_loss(loss):
  c = tiny.get_config()
  c.loss = loss
  lc.validate(c)
  return json.loads(references.to_json(c))["loss"]


def test_json_marks_unloadable_losses_and_never_crashes():
  assert _saved_loss(lambda y, p: y) == (
      "<unloadable: function tests.unit.floor.test_references:"
      "test_json_marks_unloadable_losses_and_never_crashes.<locals>.<lambda>>")

  def nested(labels, logits):
    return labels

  assert _saved_loss(nested) == (
      "<unloadable: function tests.unit.floor.test_references:"
      "test_json_marks_unloadable_losses_and_never_crashes.<locals>.nested>")
  assert _saved_loss(functools.partial(
      keras.losses.sparse_categorical_crossentropy, from_logits=True)) == (
          "<unloadable: functools.partial(keras.src.losses.losses:"
          "sparse_categorical_crossentropy, from_logits=True)>")
  assert _saved_loss(keras.losses.SparseCategoricalCrossentropy(
      from_logits=True)) == (
          "<unloadable: keras.src.losses.losses:SparseCategoricalCrossentropy("
          "name='sparse_categorical_crossentropy', reduction="
          "'sum_over_batch_size', from_logits=True, ignore_class=None)>")


def test_json_names_loadable_callables_for_resolve():
  saved = _saved_loss(_module_level_loss)
  assert saved == "tests.unit.floor.test_references:_module_level_loss"
  assert references.resolve(saved, "loss") is _module_level_loss
  saved = _saved_loss(keras.losses.SparseCategoricalCrossentropy)  # a class
  assert references.resolve(saved, "loss") is keras.losses.SparseCategoricalCrossentropy


class _Holder:
  """An object JSON cannot hold, made from arguments it keeps (one not)."""

  def __init__(self, size, name="x", scratch=None):
    self.size, self.name, self._scratch = size, name, scratch


def test_json_describes_any_other_object_a_config_holds():
  c = tiny.get_config()
  c.model.objects = [keras.callbacks.EarlyStopping("val_accuracy", patience=3),
                     _Holder(2), object()]
  c.model.rate = np.float32(0.5)  # NumPy's numbers are numbers
  saved = json.loads(references.to_json(c))["model"]
  assert saved["objects"] == [
      "<unloadable: keras.src.callbacks.early_stopping:EarlyStopping("
      "monitor='val_accuracy', min_delta=0, patience=3, verbose=0,"
      " mode='auto', baseline=None, restore_best_weights=False,"
      " start_from_epoch=0)>",
      "<unloadable: tests.unit.floor.test_references:_Holder(size=2,"
      " name='x')>",
      "<unloadable: instance of builtins:object>"]
  assert saved["rate"] == 0.5


def test_resolve_rejects_an_unloadable_marker():
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "unloadable-callable", object="function m:f.<locals>.<lambda>")):
    references.resolve("<unloadable: function m:f.<locals>.<lambda>>", "loss")


# --- A config file named by path is executed once per process --------------


def test_config_file_by_path_is_executed_once(tmp_path, monkeypatch):
  log = tmp_path / "executions.txt"
  experiment = tmp_path / "counted_experiment.py"
  experiment.write_text(
      f"with open({str(log)!r}, 'a') as f:\n  f.write('x')\n"
      "def model_fn(config):\n  return 'model'\n"
      "def dataset_fn(config, split):\n  return 'data'\n")
  monkeypatch.chdir(tmp_path)
  model_fn = references.resolve(f"{experiment}:model_fn", "model_fn")
  dataset_fn = references.resolve("counted_experiment.py:dataset_fn", "dataset_fn")
  again = references.resolve(f"{tmp_path}/./counted_experiment.py:model_fn", "x")
  assert log.read_text() == "x"
  assert again is model_fn and model_fn(None) == "model"
  assert dataset_fn(None, "train") == "data"
  # Saved to JSON, a function of the file is named by the file's path.
  c = lc.default_config()
  c.model_fn = model_fn
  assert json.loads(references.to_json(c))["model_fn"] == (
      "counted_experiment.py:model_fn")
  # A file Python already imported as a module is not run a second time.
  assert references.resolve(f"{ROOT}/tests/fixtures/tiny.py:model_fn",
                            "x") is tiny.model_fn
