"""The catalogue's rows that take more than a config override: a dataset_fn
or a model that does not fit, a damaged workdir, bad data deep in a split.

Each test makes its fault in-process (tests/fixtures/tiny.py through
`looper.run.run`, on test_catalogue's trained workdir where a run is
refused) and asserts the row's line from docs/catalogue.toml through
`catalogue.line(id)`: where the run held a workdir, its checkpoints and
config.json keep their bytes and mtimes.
"""

import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import errors
from looper import run
from tests.fixtures import catalogue
from tests.fixtures import tiny
from tests.fixtures.configs import configured
# The fixtures: the trained run every case is thrown at, the command line.
from tests.unit.cli.test_parsing import parse  # pylint: disable=unused-import
from tests.unit.run.test_catalogue import (  # pylint: disable=unused-import
    assert_fails, config, run_files, trained, workdir)

SETS = {"val": "test[:50%]", "test": "test[50%:]"}


def by_name_only(c, split):
  """tiny's data loaded by the split's name, its slice ignored: a first
  dataset_fn as a user writes it."""
  x, y = tiny.make_data(c.model.num_examples,
                        seed={"train": 0, "test": 1}[lc.parse_split(split)[0]])
  return (x, y) if c.data.as_arrays else tf.data.Dataset.from_tensor_slices(
      (x, y))


@pytest.mark.parametrize("fields,values", [
    pytest.param({"data.eval_splits": SETS, "data.eval_split": ""},
                 dict(field="eval_splits['test']", split="'test[50%:]'",
                      name="'test'", count=501), id="eval-set"),
    pytest.param({"data.train_split": "train[:90%]", "data.as_arrays": True},
                 dict(field="train_split", split="'train[:90%]'",
                      name="'train'", count=901), id="train-arrays"),
])
def test_a_slice_dataset_fn_did_not_take(workdir, fields, values):
  """A split named with a slice holds that slice's count of its split's
  examples, or the run is refused naming the field (tiny slices right:
  every other test with slices passes the check)."""
  c = config(fields)
  c.dataset_fn = by_name_only
  assert_fails(c, workdir, catalogue.line("slice-not-taken", **values))


def test_a_train_split_smaller_than_an_update_is_one_warning(workdir, caplog):
  """512 examples under a batch of 1024 would train on repeated examples
  without a word: one warning line before training, nothing refused."""
  caplog.set_level(logging.WARNING, logger="absl")
  before = run_files(workdir)
  run.Run(config({"data.train_split": "train[:24]",
                  "train.grad_accum_steps": 2}), str(workdir), "train")
  warned = [r.getMessage() for r in caplog.records]
  assert len(warned) == 1 and re.fullmatch(
      catalogue.line("train-split-smaller-than-an-update"), warned[0])
  assert run_files(workdir) == before
  caplog.clear()
  run.Run(config({"data.train_split": "train[:64]",
                  "train.grad_accum_steps": 2}), str(workdir), "train")
  assert not caplog.records


def test_wrong_type_in_get_config(tmp_path, parse):
  """ml_collections raises TypeError at the assignment in get_config()
  (a str for an int field; a float takes the same path).

  Like any other error raised by the config file's own code (see
  test_parsing.test_error_in_get_config_surfaces_with_traceback) it keeps the
  traceback to the file's line, then ends in the one looper line.
  """
  config_file = tmp_path / "typed.py"
  config_file.write_text("from tests.fixtures import tiny\n\n"
                         "def get_config():\n"
                         "  c = tiny.get_config()\n"
                         "  c.train.steps = \"100\"\n"
                         "  return c\n")
  with pytest.raises(TypeError) as raised:  # what get_config() will raise
    tiny.get_config().train.steps = "100"
  lines = parse(f"--config={config_file}", f"--workdir={tmp_path}/run")
  assert f'  File "{config_file}", line 5, in get_config' in lines
  assert re.fullmatch("looper: " + catalogue.line(
      "config-file-wrong-type", file=config_file,
      error=repr(raised.value))[2:], lines[-1]), lines[-1]
  assert not (tmp_path / "run").exists()


# --- Examples, model and loss that do not fit ---------------------------------


def dataset_where(change, splits=("train", "test")):
  """tiny's dataset_fn, with `change(x, y)` -> the tensors of `splits`."""

  def dataset_fn(c, split):
    name, selected = lc.split_slice(split, c.model.num_examples)
    x, y = tiny.make_data(c.model.num_examples,
                          seed={"train": 0, "test": 1}[name])
    x, y = x[selected], y[selected]
    return tf.data.Dataset.from_tensor_slices(
        change(x, y) if name in splits else (x, y))

  return dataset_fn


_SPEC_8 = "TensorSpec(shape=(8,), dtype=tf.float32, name=None)"
_SPEC_ID = "TensorSpec(shape=(), dtype=tf.int32, name=None)"
_FLOAT_LABELS = lambda x, y: (x, y.astype(np.float32))
_ONE_HOT = lambda x, y: (x, np.eye(4, dtype=np.int32)[y])
_FIVE_FEATURES = lambda x, y: (x[:, :5], y)


def _in_both_splits(case, change, want):
  """The case on the train split, and on the eval split: checked alike,
  before training."""
  return [pytest.param(split, change, want(split), id=prefix + case)
          for split, prefix in (("train", ""), ("test", "eval-"))]


@pytest.mark.parametrize("split,change,want", [
    pytest.param("train", lambda x, y: (x, y, y, y), catalogue.line(
        "four-tuples", specs=f"({_SPEC_8}, {_SPEC_ID}, {_SPEC_ID},"
        f" {_SPEC_ID})"), id="4-tuples"),
    pytest.param("train", lambda x, y: {"x": x, "y": y}, catalogue.line(
        "four-tuples", specs=f"{{'x': {_SPEC_8}, 'y': {_SPEC_ID}}}"),
                 id="dict"),
    pytest.param("train", lambda x, y: (x, y, y),
                 catalogue.line("int-weights"), id="int-weights"),
    pytest.param("train", lambda x, y: (x, y, np.where(
        y == 2, -0.5, 1.0).astype(np.float32)), catalogue.line(
            "weight-negative-or-nan", weight=-0.5), id="negative-weight"),
    pytest.param("train", lambda x, y: (x, y, np.where(
        y == 2, np.nan, 1.0).astype(np.float32)), catalogue.line(
            "weight-negative-or-nan", weight="nan"), id="nan-weight"),
    pytest.param("train", lambda x, y: (x, y, np.ones([len(y), 3],
                                                      np.float32)),
                 catalogue.line("weights-wrong-shape"),
                 id="weights-per-class"),
    *_in_both_splits("float-labels", _FLOAT_LABELS, lambda split: (
        catalogue.line("float-labels", split=split))),
    *_in_both_splits("one-hot-labels", _ONE_HOT, lambda split: (
        catalogue.line("one-hot-labels", split=split))),
    *_in_both_splits("5-features-for-8", _FIVE_FEATURES, lambda split: (
        catalogue.line("inputs-the-model-rejects", split=split))),
    pytest.param("train", lambda x, y: (x, y + 1), catalogue.line(
        "class-id-out-of-range", split="train", top=4, bottom=1),
                 id="class-id-too-large"),
    pytest.param("train", lambda x, y: (x, y - 1), catalogue.line(
        "class-id-out-of-range", split="train", top=2, bottom=-1),
                 id="class-id-negative"),
    pytest.param("test", lambda x, y: (x, y + 4), catalogue.line(
        "class-id-out-of-range", split="test", top=7, bottom=4),
                 id="eval-class-id-too-large"),
])
def test_examples_that_do_not_fit(workdir, split, change, want):
  c = config({"dataset_fn": dataset_where(change, splits=(split,))})
  assert_fails(c, workdir, want)


def mean_loss(labels, logits):
  """Wrong: the batch mean, where looper wants one loss per example."""
  return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True))


def test_loss_returning_a_scalar(workdir):
  assert_fails(config({"loss": mean_loss}), workdir,
               catalogue.line("loss-returns-a-scalar"))


def test_class_weights_missing_a_class(workdir):
  assert_fails(config({"data.class_weights": (1.0, 2.0)}), workdir,
               catalogue.line("class-weights-missing-a-class"))


def _heads(fields):
  """tiny's data (labels: class ids) under weighted's two-head model."""
  from tests.fixtures import weighted  # pylint: disable=g-import-not-at-top
  c = config({"model_fn": weighted.model_fn, "metrics": ()})
  c.model.kind = "heads"
  return configured(c, fields)


def test_outputs_and_losses_that_do_not_match(workdir):
  assert_fails(_heads({}), workdir,
               catalogue.line("one-loss-for-dict-outputs"))
  assert_fails(_heads({"loss": {"klass": "sparse_categorical_crossentropy"}}),
               workdir, catalogue.line("loss-for-a-missing-output"))
  assert_fails(_heads({"loss": {"class": "sparse_categorical_crossentropy"}}),
               workdir, catalogue.line("labels-without-an-output"))


def test_eval_batch_larger_than_the_eval_split_is_padded(workdir):
  """Not an error: one padded, masked batch counts each example once."""
  before = run_files(workdir)
  small = run.run(config({"eval.batch_size": 64}), str(workdir), "eval")
  large = run.run(config({"eval.batch_size": 4096}), str(workdir), "eval")
  assert large["eval"]["examples"] == small["eval"]["examples"] == 1001
  assert large["eval"]["accuracy"] == small["eval"]["accuracy"]
  assert large["eval"]["loss"] == pytest.approx(small["eval"]["loss"],
                                                rel=1e-6)
  assert run_files(workdir) == before


def test_missing_mnist_data_dir(tmp_path):
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  c = mnist.get_config()
  nowhere = tmp_path / "nowhere"
  c.data.dir = str(nowhere)
  c.model.width, c.train.steps = 4, 2
  with pytest.raises(lc.ConfigError,
                     match=catalogue.line("mnist-dir-missing", dir=nowhere)):
    run.run(c, str(tmp_path / "run"), mode="train")
  assert not (tmp_path / "run").exists()


# --- Workdirs and checkpoints -------------------------------------------------


def test_workdir_holding_a_different_model(workdir):
  newest = workdir / "checkpoints" / "ckpt-20"
  assert_fails(config({"model.width": 32}), workdir, catalogue.line(
      "checkpoint-of-another-model", checkpoint=newest, workdir=workdir))


def _damage(data_file, how):
  size = data_file.stat().st_size
  if how == "truncated":
    with open(data_file, "r+b") as f:
      f.truncate(size // 2)
  else:
    data_file.write_bytes(bytes(size))


@pytest.mark.parametrize("how", ["truncated", "zeroed"])
def test_unreadable_newest_checkpoint_falls_back(workdir, how, caplog):
  caplog.set_level(logging.DEBUG, logger="absl")
  ckpts = workdir / "checkpoints"
  newest, older = ckpts / "ckpt-20", ckpts / "ckpt-10"
  _damage(ckpts / "ckpt-20.data-00000-of-00001", how)
  result = run.run(config(), str(workdir), mode="train")
  messages = [r.getMessage() for r in caplog.records]
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "cannot be read" in
              r.getMessage()]
  assert len(warnings) == 1, warnings
  assert re.fullmatch(catalogue.line("newest-checkpoint-unreadable",
                                     newest=newest, older=older),
                      warnings[0]), warnings[0]
  assert f"Restored {older}" in messages
  assert result["step"] == 30
  for step in (20, 30):  # ckpt-20 written afresh on the way to 30
    reader = tf.train.load_checkpoint(str(ckpts / f"ckpt-{step}"))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == step
  assert tf.train.latest_checkpoint(str(ckpts)) == str(ckpts / "ckpt-30")


def test_unreadable_only_checkpoint(workdir):
  ckpts = workdir / "checkpoints"
  for path in ckpts.glob("ckpt-10.*"):
    path.unlink()
  _damage(ckpts / "ckpt-20.data-00000-of-00001", "truncated")
  only = ckpts / "ckpt-20"
  # Between the parentheses: TensorFlow's words for the damage.
  assert_fails(config(), workdir, catalogue.line(
      "only-checkpoint-unreadable", checkpoint=only, checkpoints=ckpts))


# --- Through the command line: one line, no traceback -------------------------


def test_eval_of_a_checkpoint_that_does_not_exist(workdir):
  missing = workdir / "checkpoints" / "ckpt-15"
  assert_fails(config(), workdir, catalogue.line(
      "checkpoint-flag-missing", path=missing, workdir=workdir),
               mode="eval", checkpoint_path=str(missing))


def test_workdir_under_a_regular_file(tmp_path):
  """Root ignores chmod, so the unwritable workdir is one under a file."""
  afile = tmp_path / "afile"
  afile.write_text("not a directory")
  workdir = afile / "run"
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "workdir-under-a-file", workdir=workdir, file=afile)):
    run.run(config({"train.steps": 3}), str(workdir))
  assert afile.read_text() == "not a directory"


# --- Bad data deep in a split: past the examples the probe reads -------------


DEEP = 1500  # an example of global batch 47 of 32 (steps 41-50: one loop)


def deep_data(split_changed, change):
  """tiny's dataset_fn over 2000 examples in order, example DEEP of
  `split_changed` changed by `change(x, y)`; the probe reads only the
  first 256."""
  def dataset_fn(config, split):
    x, y = tiny.make_data(2000, seed=0 if split == "train" else 1)
    if split == split_changed:
      x, y = change(x.copy(), y.copy())
    return tf.data.Dataset.from_tensor_slices((x, y))
  return dataset_fn


def _bad_label(x, y):
  y[DEEP] = 7  # 4 classes
  return x, y


def _nan_input(x, y):
  x[DEEP, 3] = np.nan
  return x, y


def _shorter(config, split):
  """A generator that promises 8 features and yields 5 at example DEEP."""
  x, y = tiny.make_data(2000, seed=0 if split == "train" else 1)
  return tf.data.Dataset.from_generator(
      lambda: ((x[i][:5] if i == DEEP and split == "train" else x[i], y[i])
               for i in range(len(y))),
      output_signature=(tf.TensorSpec([8], tf.float32),
                        tf.TensorSpec([], tf.int32)))


@pytest.mark.parametrize("dataset_fn,numerics", [
    pytest.param(deep_data("train", _bad_label), False,
                 id="label-out-of-range"),
    # A NaN input fails only where the user turned TensorFlow's checks on.
    pytest.param(deep_data("train", _nan_input), True,
                 id="nan-input-checked"),
    pytest.param(_shorter, False, id="later-example-of-another-shape"),
])
def test_bad_data_deep_in_the_train_split(tmp_path, dataset_fn, numerics):
  c = configured(tiny.get_config(), dataset_fn=dataset_fn,
                 data__shuffle_buffer=0, train__steps=60)
  if numerics:
    tf.debugging.enable_check_numerics()
  try:
    with pytest.raises(errors.DataError) as e:
      run.run(c, str(tmp_path), mode="train")
  finally:
    if numerics:
      tf.debugging.disable_check_numerics()
  # Between the parentheses: TensorFlow's words for what broke.
  assert re.fullmatch(catalogue.line("deep-bad-train-data"),
                      str(e.value)), str(e.value)
  # tiny saves every 20 steps: the state of steps 41-46 was never saved.
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")) == str(
      tmp_path / "checkpoints" / "ckpt-40")


def test_bad_data_deep_in_the_eval_split(tmp_path):
  c = configured(tiny.get_config(), dataset_fn=deep_data("test", _bad_label))
  with pytest.raises(errors.DataError) as e:
    run.run(c, str(tmp_path), mode="train_and_eval")
  assert re.fullmatch(catalogue.line("deep-bad-eval-data"),
                      str(e.value)), str(e.value)
  # Evaluation runs before the save of its step: step 20 was not saved.
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")) is None


def _softmax_model(config):
  return keras.Sequential([
      keras.Input((tiny.FEATURES,)), keras.layers.Dense(16, activation="relu"),
      keras.layers.Dense(tiny.NUM_CLASSES, activation="softmax",
                         name="probabilities")])


def test_a_final_softmax_under_a_loss_on_logits(workdir):
  assert_fails(config({"model_fn": _softmax_model}), workdir,
               catalogue.line("final-softmax"))



def test_checkpoint_flag_outside_eval_mode(workdir):
  path = workdir / "checkpoints" / "ckpt-10"
  assert_fails(config(), workdir, catalogue.line(
      "checkpoint-flag-in-training", path=path), checkpoint_path=str(path))
