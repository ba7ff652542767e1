"""Regression tests, one section per fixed bug; each failed before its fix."""

import functools
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import objectives
from looper import optimizers
from looper import refs
from looper.data import checks
from looper.data import elements
from looper.data import sources
from tests import tiny
from tests.conftest import ROOT, run_looper

# --- An empty train split fails in one line instead of spinning forever -----

_EMPTY_TRAIN = ("config.data.train_split='train[:0]' selects no examples:"
                " config.dataset_fn returned an empty dataset; widen"
                " --config.data.train_split or check the data dataset_fn"
                " reads")


def _empty():
  return tf.data.Dataset.from_tensor_slices(
      (np.zeros((0, 8), np.float32), np.zeros((0,), np.int32)))


def _filtered_to_nothing():
  x, y = tiny.make_data(50, seed=0)
  everything = tf.data.Dataset.from_tensor_slices((x, y))
  return everything.filter(lambda x, y: y > 100)  # unknown cardinality


@pytest.mark.parametrize("examples", [_empty, _filtered_to_nothing])
def test_check_nonempty_names_the_split(examples):
  with pytest.raises(lc.ConfigError) as e:
    checks.check_nonempty(examples(), "train[:0]")
  assert str(e.value) == _EMPTY_TRAIN
  with pytest.raises(lc.ConfigError) as e:
    checks.check_nonempty(examples(), "test[5:5]", field="data.eval_split")
  assert str(e.value).startswith(
      "config.data.eval_split='test[5:5]' selects no examples:")


def test_check_nonempty_keeps_a_nonempty_dataset():
  x, y = tiny.make_data(50, seed=0)
  kept = tf.data.Dataset.from_tensor_slices((x, y)).filter(
      lambda x, y: y == 0)  # unknown cardinality, some examples
  assert checks.check_nonempty(kept, "train") is kept


@pytest.mark.parametrize("examples", [_empty, _filtered_to_nothing])
def test_empty_train_stream_raises_instead_of_spinning(examples):
  # Before the fix, iterating this stream never returned: every epoch's
  # flat_map yielded nothing, forever.
  with pytest.raises(lc.ConfigError) as e:
    elements.train_dataset(examples(), tf.distribute.InputContext(),
                       global_batch_size=8, seed=0, shuffle_buffer=16,
                       position=0, split="train[:0]")
  assert str(e.value) == _EMPTY_TRAIN
  with pytest.raises(lc.ConfigError) as e:  # no split given: still one line
    tf.distribute.get_strategy().distribute_datasets_from_function(
        lambda ctx: sources.Elements(examples, None).train(
            ctx, global_batch_size=8, seed=0, shuffle_buffer=16, position=0))
  assert str(e.value) == (
      "config.data.train_split selects no examples: config.dataset_fn"
      " returned an empty dataset; widen --config.data.train_split or check"
      " the data dataset_fn reads")


def test_empty_eval_split_is_counted_as_an_error():
  with pytest.raises(lc.ConfigError) as e:
    checks.num_examples(_filtered_to_nothing(), "test[:0]")
  assert str(e.value) == (
      "config.data.eval_split='test[:0]' selects no examples:"
      " config.dataset_fn returned an empty dataset; widen"
      " --config.data.eval_split or check the data dataset_fn reads")


# --- An error inside the user's get_config() keeps its traceback -----------

_ENV_CONFIG = """\
import os
from tests import tiny

def get_config():
  c = tiny.get_config()
  c.data.dir = os.environ["LOOPER_TEST_MISSING_VAR"]
  return c
"""


@pytest.mark.slow  # a subprocess
def test_error_in_get_config_surfaces_with_traceback(tmp_path):
  config = tmp_path / "env_config.py"
  config.write_text(_ENV_CONFIG)
  proc = run_looper(f"--config={config}", f"--workdir={tmp_path}/run",
                    "--config.train.steps=3")
  assert proc.returncode == 1
  assert "the config has no field" not in proc.stderr, proc.stderr[-2000:]
  assert "Traceback (most recent call last):" in proc.stderr
  # The traceback points at the failing line of the config file.
  assert f'File "{config}", line 6, in get_config' in proc.stderr
  assert 'c.data.dir = os.environ["LOOPER_TEST_MISSING_VAR"]' in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      f"looper: --config={config}: loading the config file raised"
      " KeyError('LOOPER_TEST_MISSING_VAR'); see the traceback above")
  assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a subprocess
def test_attribute_error_at_config_module_level_is_not_an_override(tmp_path):
  config = tmp_path / "typo_config.py"
  config.write_text("from looper import config as lc\n"
                    "DEFAULTS = lc.defualt_config()\n"
                    "def get_config():\n  return DEFAULTS\n")
  proc = run_looper(f"--config={config}", f"--workdir={tmp_path}/run")
  assert proc.returncode == 1
  assert "the config has no field" not in proc.stderr
  assert f'File "{config}", line 2, in <module>' in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      f"looper: --config={config}: loading the config file raised"
      " AttributeError(")


@pytest.mark.slow  # a subprocess
def test_override_errors_are_still_one_line(tmp_path):
  proc = run_looper("--config", "tests/tiny.py", f"--workdir={tmp_path}",
                    "--config.train.step=5")
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      "looper: --config.train.step: the config has no field 'step'; did you"
      " mean --config.train.steps?")


# --- Losses that are not plain functions are written to config.json --------


def _module_level_loss(labels, logits):
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


def _saved_loss(loss):
  c = tiny.get_config()
  c.loss = loss
  lc.validate(c)
  return json.loads(refs.to_json(c))["loss"]


def test_json_marks_unloadable_losses_and_never_crashes():
  assert _saved_loss(lambda y, p: y) == (
      "<unloadable: function tests.test_bugs:"
      "test_json_marks_unloadable_losses_and_never_crashes.<locals>.<lambda>>")

  def nested(labels, logits):
    return labels

  assert _saved_loss(nested) == (
      "<unloadable: function tests.test_bugs:"
      "test_json_marks_unloadable_losses_and_never_crashes.<locals>.nested>")
  assert _saved_loss(functools.partial(
      keras.losses.sparse_categorical_crossentropy, from_logits=True)) == (
          "<unloadable: functools.partial(keras.src.losses.losses:"
          "sparse_categorical_crossentropy, from_logits=True)>")
  assert _saved_loss(keras.losses.SparseCategoricalCrossentropy(
      from_logits=True)) == (
          "<unloadable: instance of keras.src.losses.losses:"
          "SparseCategoricalCrossentropy>")


def test_json_names_loadable_callables_for_resolve():
  saved = _saved_loss(_module_level_loss)
  assert saved == "tests.test_bugs:_module_level_loss"
  assert refs.resolve(saved, "loss") is _module_level_loss
  saved = _saved_loss(keras.losses.SparseCategoricalCrossentropy)  # a class
  assert refs.resolve(saved, "loss") is keras.losses.SparseCategoricalCrossentropy


def test_resolve_rejects_an_unloadable_marker():
  with pytest.raises(lc.ConfigError) as e:
    refs.resolve("<unloadable: function m:f.<locals>.<lambda>>", "loss")
  assert str(e.value) == (
      "config.loss='<unloadable: function m:f.<locals>.<lambda>>' was saved"
      " from an object that cannot be loaded back; set config.loss in"
      " get_config() to a module-level function or a 'module:name' string")


# --- A config file named by path is executed once per process --------------


def test_config_file_by_path_is_executed_once(tmp_path, monkeypatch):
  log = tmp_path / "executions.txt"
  experiment = tmp_path / "counted_experiment.py"
  experiment.write_text(
      f"with open({str(log)!r}, 'a') as f:\n  f.write('x')\n"
      "def model_fn(config):\n  return 'model'\n"
      "def dataset_fn(config, split):\n  return 'data'\n")
  monkeypatch.chdir(tmp_path)
  model_fn = refs.resolve(f"{experiment}:model_fn", "model_fn")
  dataset_fn = refs.resolve("counted_experiment.py:dataset_fn", "dataset_fn")
  again = refs.resolve(f"{tmp_path}/./counted_experiment.py:model_fn", "x")
  assert log.read_text() == "x"
  assert again is model_fn and model_fn(None) == "model"
  assert dataset_fn(None, "train") == "data"
  # Saved to JSON, a function of the file is named by the file's path.
  c = lc.default_config()
  c.model_fn = model_fn
  assert json.loads(refs.to_json(c))["model_fn"] == (
      "counted_experiment.py:model_fn")
  # A file Python already imported as a module is not run a second time.
  assert refs.resolve(f"{ROOT}/tests/tiny.py:model_fn", "x") is tiny.model_fn


# --- Warmup: the first update uses peak / warmup_steps, not 0 ---------------


def _rates(schedule, steps):
  return [float(schedule(tf.constant(i, tf.int64))) for i in steps]


@pytest.mark.parametrize("decay,after_warmup", [
    # Keras calls the schedule with iterations = k - 1 for update k. Warmup
    # 4, total 10: updates 1-4 ramp to the peak, updates 5-10 decay over the
    # 6 post-warmup updates, and the rate after update 10 is 0.
    ("constant", [1, 1, 1, 1, 1, 1, 1]),
    ("linear", [1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0]),
    ("cosine", [1, 0.5 * (1 + np.cos(np.pi / 6)), 0.75, 0.5, 0.25,
                0.5 * (1 + np.cos(5 * np.pi / 6)), 0]),
])
def test_warmup_first_update_is_not_zero(decay, after_warmup):
  schedule = optimizers.WarmupSchedule(2.0, 4, decay, 10)
  want = [0.5, 1.0, 1.5, 2.0] + [2.0 * f for f in after_warmup]
  np.testing.assert_allclose(_rates(schedule, range(11)), want, atol=1e-6)
  assert _rates(schedule, [11, 1000]) == [want[-1]] * 2


def test_without_warmup_the_schedule_is_unchanged():
  linear = optimizers.WarmupSchedule(1.0, 0, "linear", 4)
  np.testing.assert_allclose(_rates(linear, range(5)), [1, .75, .5, .25, 0])


def test_first_optimizer_update_uses_the_warmup_rate():
  c = lc.default_config().optimizer
  c.name, c.momentum, c.learning_rate, c.warmup_steps = "sgd", 0.0, 1.0, 4
  opt = optimizers.build(c, total_steps=10, global_batch_size=32)
  w = tf.Variable([0.0])
  opt.apply_gradients([(tf.constant([1.0]), w)])
  assert float(w[0]) == pytest.approx(-0.25)  # rate 1.0 / 4, not 0


# --- Metric names that collide with looper's own log keys ------------------


@pytest.mark.parametrize("name", ["examples", "examples_per_sec",
                                  "learning_rate", "loss", "steps_per_sec"])
def test_metric_names_looper_reports_are_rejected(name):
  with pytest.raises(lc.ConfigError) as e:
    objectives.check_metric_names(["accuracy", name])
  assert str(e.value) == (
      f"config.metrics: a metric is named {name!r}, which looper reports"
      f" itself; give it another name (e.g. keras.metrics.Mean("
      f"name='my_{name}'))")


def test_metric_names_must_be_distinct():
  objectives.check_metric_names(["accuracy", "top5_accuracy", "my_loss"])
  with pytest.raises(lc.ConfigError) as e:
    objectives.check_metric_names(["accuracy", "top5_accuracy", "accuracy"])
  assert str(e.value) == (
      "config.metrics: two metrics are named 'accuracy', so one would hide"
      " the other in the logs; give each its own name")


def test_linear_scaling_of_the_rate_with_the_batch():
  c = lc.default_config().optimizer
  c.learning_rate, c.reference_batch_size = 0.1, 256
  assert optimizers.peak_rate(c, 1024) == 0.1  # off by default
  c.scale_lr_with_batch = True
  assert optimizers.peak_rate(c, 1024) == pytest.approx(0.4)
  c.name, c.momentum, c.warmup_steps = "sgd", 0.0, 2
  opt = optimizers.build(c, total_steps=10, global_batch_size=1024)
  w = tf.Variable([0.0])
  for _ in range(3):  # warmup: 0.4 / 2, then the scaled peak 0.4 twice
    opt.apply_gradients([(tf.constant([1.0]), w)])
  assert float(w[0]) == pytest.approx(-1.0)
