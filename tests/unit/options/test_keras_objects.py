"""Keras loss and metric objects in config.loss / config.metrics, as a Keras
user writes them (looper.options.keras_objects).

Each loss object's first-step loss is the number Keras' own `loss(labels,
logits, sample_weight)` gives on that batch (its reduction, from_logits,
ignore_class); metric objects report what NumPy computes; what cannot work
is one line before training.
"""

import json
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import references
from looper.cli import describe
from looper.errors import ConfigError
from looper.measure import dry_run
from looper.options import losses
from tests.fixtures import forks
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures import tiny_keras
from tests.fixtures.configs import configured
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV

BATCH = 32
CLASS_WEIGHTS = (1.0, 2.0, 0.5, 1.5)


def _config(loss, **fields):
  c = configured(tiny.get_config(), {
      "data.shuffle_buffer": 0, "train.batch_size": BATCH, "model.l2": 0.0,
      **fields})
  c.loss = loss
  return c


def _check_train(trainer, config):
  """dry_run's check of the train split, as the Run calls it."""
  dry_run.check_split(trainer, trainer.input, "train", loss=config.loss,
                      metrics=config.metrics, data=config.data)


def _first_batch():
  x, y = tiny.make_data(tiny.get_config().model.num_examples, seed=0)
  return x[:BATCH], y[:BATCH]


@pytest.mark.parametrize("loss,fields,weighted", [
    (keras.losses.SparseCategoricalCrossentropy(from_logits=True), {}, False),
    (keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight"),
     {"data.class_weights": CLASS_WEIGHTS}, True),
    (keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                ignore_class=3), {}, False),
    (keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                reduction=None),
     {"loss_normalization": "weights", "data.class_weights": CLASS_WEIGHTS},
     True),
], ids=["default", "mean_with_sample_weight", "ignore_class", "none"])
def test_a_loss_object_trains_on_what_keras_computes(loss, fields, weighted):
  config = _config(loss, **fields)
  lc.validate(config)
  trainer = pieces.trainer(config, tf.distribute.get_strategy())
  x, y = _first_batch()
  logits = trainer.model(x)
  weights = np.take(CLASS_WEIGHTS, y) if weighted else None
  if loss.get_config()["ignore_class"] is not None:
    assert 0 < (y == 3).sum() < BATCH  # some are ignored, not all
  # Keras' own reduction, `none` as the weighted mean it is configured as.
  want = (float(loss(y, logits, sample_weight=weights)) if loss.reduction
          else float(np.sum(weights * loss(y, logits)) / np.sum(weights)))
  np.testing.assert_allclose(trainer.train(1)[0]["loss"][0], want, rtol=1e-6)


def test_ignored_labels_count_nowhere_in_eval():
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                    ignore_class=3)
  trainer = pieces.trainer(_config(loss), tf.distribute.get_strategy())
  logs = pieces.evaluator(trainer).evaluate()
  x, y = tiny.make_data(tiny.get_config().model.num_examples, seed=1)
  logits = trainer.model(x).numpy()
  kept = y != 3
  np.testing.assert_allclose(logs["loss"], float(loss(y, logits)), rtol=1e-5)
  np.testing.assert_allclose(
      logs["accuracy"], np.mean(logits[kept].argmax(1) == y[kept]),
      rtol=1e-6)


def test_metric_objects_are_fresh_copies_and_report_what_numpy_does():
  config = tiny_keras.get_config()
  top2 = config.metrics[1]
  trainer = pieces.trainer(config, tf.distribute.get_strategy())
  trainer.train(20)
  logs = pieces.evaluator(trainer).evaluate()
  x, y = tiny.make_data(config.model.num_examples, seed=1)
  logits = trainer.model(x).numpy()
  in_top2 = (np.argsort(-logits, axis=1)[:, :2] == y[:, None]).any(axis=1)
  np.testing.assert_allclose(logs["sparse_top_k_categorical_accuracy"],
                             in_top2.mean(), rtol=1e-6)
  assert 0.5 < in_top2.mean() < 1  # trained, and not trivially 1
  # The config's own object was never updated: copies were.
  assert float(top2.result()) == 0.0
  assert "k=2" in references.to_json(config)  # config.json says how it was made


@pytest.mark.slow  # a process of its own (its devices)
def test_a_metric_object_in_a_config_file_leaves_the_devices_free():
  # The objects are made while the command line loads the file, before
  # looper splits the CPU into 2 devices for 2 replicas.
  proc = forks.run(
      [sys.executable, "-m", "looper.main", "--mode=describe",
       "--config=tests/fixtures/tiny_keras.py",
       "--config.distribution.num_cpu_devices=2"],
      cwd=ROOT, env={**os.environ, "PYTHONPATH": PYTHONPATH, **LOOPBACK_ENV},
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "  strategy   Mirrored, 2 replicas (2 CPU)" in proc.stdout


class _Unbuildable(keras.metrics.Mean):
  """A metric whose get_config() misses an argument of its __init__."""

  def __init__(self, scale):
    super().__init__(name="scaled")
    self.scale = scale


@pytest.mark.parametrize("change,error", [
    (dict(loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum")),
     "config.loss=SparseCategoricalCrossentropy(reduction='sum',"
     " from_logits=True, ignore_class=None): looper averages each update's"
     " losses over the global batch itself, which a reduction 'sum' would"
     " not give; pass reduction='sum_over_batch_size' (Keras' default) or"
     " 'mean_with_sample_weight' to the loss"),
    (dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
          loss_normalization="weights"),
     "config.loss_normalization='weights', but"
     " config.loss=SparseCategoricalCrossentropy(reduction="
     "'sum_over_batch_size', from_logits=True, ignore_class=None) averages"
     " by 'batch_size'; drop one: leave loss_normalization at 'batch_size',"
     " or pass reduction=None to the loss"),
    (dict(loss={"a": keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=0)}, metrics={"a": ()}),
     "config.loss['a']=SparseCategoricalCrossentropy(reduction="
     "'sum_over_batch_size', from_logits=True, ignore_class=0): ignore_class"
     " works on one output only; weigh the examples of each output by a"
     " third element per example (a dict of weights by output) instead"),
    (dict(metrics=("accuracy", _Unbuildable(2.0))),
     "config.metrics: _Unbuildable cannot be rebuilt from its get_config()"
     " (_Unbuildable.__init__() got an unexpected keyword argument 'name');"
     " give a zero-argument factory instead, e.g. lambda: _Unbuildable(...)"),
], ids=["sum", "normalization-disagrees", "ignore-per-output",
        "unbuildable-metric"])
def test_objects_that_cannot_work_are_one_line_at_validate(change, error):
  config = tiny.get_config()
  for field, value in change.items():
    config[field] = value
  with pytest.raises(ConfigError) as e:
    lc.validate(config)
  assert str(e.value) == error


@pytest.mark.parametrize("change,error", [
    (dict(loss=keras.losses.SparseCategoricalCrossentropy()),
     "config.loss=SparseCategoricalCrossentropy(reduction="
     "'sum_over_batch_size', from_logits=False, ignore_class=None) reads"
     " probabilities (from_logits=False), but the model's last layer"
     " 'dense_1' returns logits (no softmax or sigmoid); pass"
     " from_logits=True to it"),
    (dict(metrics=("accuracy", keras.metrics.SparseCategoricalCrossentropy(
        name="xent"))),
     "config.metrics=SparseCategoricalCrossentropy(from_logits=False,"
     " ignore_class=None, axis=-1) reads probabilities (from_logits=False), but the model's"
     " last layer 'dense_1' returns logits (no softmax or sigmoid); pass"
     " from_logits=True to it"),
    (dict(metrics=("accuracy", keras.metrics.AUC(from_logits=True))),
     "config.metrics: 'auc' fails on outputs of shape [8, 4] and labels of"
     " shape [8] of split 'train'"),
], ids=["loss-from-logits-false", "metric-from-logits-false",
        "metric-does-not-fit"])
def test_objects_that_do_not_fit_the_model_are_one_line_before_training(
    change, error):
  config = tiny.get_config()
  for field, value in change.items():
    config[field] = value
  trainer = pieces.trainer(config, tf.distribute.get_strategy())
  with pytest.raises(ConfigError) as e:
    _check_train(trainer, config)
  # The last Dense's name counts the layers the process made before.
  last = trainer.model.layers[-1].name
  assert str(e.value).startswith(error.replace("'dense_1'", repr(last)))


def test_describe_shows_a_metric_object_as_a_run_logs_it():
  assert "sparse_top_k_categorical_accuracy" not in describe.describe(
      tiny.get_config())
  text = describe.describe(tiny_keras.get_config())
  # The config: each object by its class and arguments, no "unloadable"
  # (config.json's marker: test_references).
  config = json.loads(text[text.index("\nconfig\n") + len("\nconfig\n"):])
  assert config["loss"] == (
      "keras.src.losses.losses:SparseCategoricalCrossentropy(name="
      "'sparse_categorical_crossentropy', reduction='sum_over_batch_size',"
      " from_logits=True, ignore_class=None)")
  assert config["metrics"] == [
      "accuracy", "keras.src.metrics.accuracy_metrics:"
      "SparseTopKCategoricalAccuracy(name='sparse_top_k_categorical_accuracy',"
      " dtype='float32', k=2)"]
  assert "unloadable" not in text


def _softmax_op_model(config):  # pylint: disable=unused-argument
  inputs = keras.Input((tiny.FEATURES,))
  return keras.Model(inputs, keras.ops.softmax(keras.layers.Dense(4)(inputs)))


def test_a_final_softmax_op_counts_as_a_softmax_layer():
  config = tiny.get_config()
  config.model_fn = _softmax_op_model
  config.loss = keras.losses.SparseCategoricalCrossentropy()  # probabilities
  trainer = pieces.trainer(config, tf.distribute.get_strategy())
  _check_train(trainer, config)  # fits
  config.loss = "sparse_categorical_crossentropy"  # logits
  trainer = pieces.trainer(config, tf.distribute.get_strategy())
  with pytest.raises(ConfigError) as e:
    _check_train(trainer, config)
  assert "applies softmax, but config.loss='sparse_categorical_crossentropy'" \
      " takes logits" in str(e.value)


def test_ignore_class_beside_weights_under_keras_default_is_one_line():
  config = tiny.get_config()
  config.loss = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, ignore_class=-100)
  config.data.class_weights = CLASS_WEIGHTS
  with pytest.raises(ConfigError) as e:
    lc.validate(config)
  assert str(e.value) == (
      "config.loss=SparseCategoricalCrossentropy(reduction="
      "'sum_over_batch_size', from_logits=True, ignore_class=-100) with"
      " data.class_weights: Keras would divide the weighted sum by the number"
      " of labels not ignored, which looper does not; pass"
      " reduction='mean_with_sample_weight' (the weighted mean over the"
      " labels not ignored) to the loss, or drop the weights")
  # With the weighted mean, an ignored label (no class id) weighs 0.
  config.loss = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, ignore_class=-100,
      reduction="mean_with_sample_weight")
  lc.validate(config)
  labels = tf.constant([0, -100, 3])
  weights = losses.label_weighted(
      None, labels, losses.class_weight_table(CLASS_WEIGHTS), -100)
  np.testing.assert_array_equal(weights, [1.0, 0.0, 1.5])
