"""The bad-input catalogue: each bad input ends in one line, nothing harmed.

Every case asserts the exact message (the field or file, the value, the
fix) and, where the workdir holds a run, that the run is untouched: every
file under `checkpoints/` and `config.json` keep their bytes and mtimes.
Every case calls `looper.run.run` in-process (ConfigError /
CheckpointError, whose str is the line `python -m
looper.main` prints after 'looper: ', as tests/e2e/commands/test_cli.py
shows for each kind) or, for a config file's own error, the parser the
command line calls (tests/unit/cli/test_parsing.py's `parse`).

This module holds the cases no other test covers; BUILD.md's "Bad-input
catalogue" lists every case, with the test of each.
"""

import logging
import re
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import errors
from looper import run
from looper.workdir import checkpoint
from tests.fixtures import tiny
from tests.fixtures.configs import configured
# The fixture: a config file's own error through the command line's parser.
from tests.unit.cli.test_parsing import parse  # pylint: disable=unused-import


# --- The run every case is thrown at ------------------------------------------


def config(fields=None):
  """tiny to step 30, saved every 10, evaluated at the end; `fields` set.

  The trained workdir is at step 20, so a run that wrongly went ahead would
  train and save.
  """
  c = configured(tiny.get_config(), train__steps=30, eval__every_steps=0,
                 checkpoint__every_steps=10)
  return configured(c, fields or {})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A workdir after 20 steps: ckpt-10, ckpt-20, config.json, events."""
  workdir = tmp_path_factory.mktemp("trained")
  c = config({"train.steps": 20})
  run.run(c, str(workdir), mode="train")
  return workdir


@pytest.fixture
def workdir(trained, tmp_path):
  """A private copy of the trained workdir (a case may damage it)."""
  copy = tmp_path / "run"
  shutil.copytree(trained, copy)
  return copy


def run_files(workdir) -> dict[str, tuple[bytes, int]]:
  """{path: (bytes, mtime)} of everything under checkpoints/ and config.json."""
  paths = [workdir / "config.json"] if (workdir / "config.json").exists() else []
  paths += [p for p in (workdir / "checkpoints").rglob("*") if p.is_file()]
  return {str(p.relative_to(workdir)): (p.read_bytes(), p.stat().st_mtime_ns)
          for p in paths}


def assert_fails(c, workdir, want, mode="train_and_eval", **kwargs):
  """run.run fails with the one line `want` (a str, or a regex to match
  whole), and leaves the checkpoints and config.json as they were."""
  before = run_files(workdir)
  assert before, "the case needs a workdir holding a run"
  with pytest.raises((lc.ConfigError, checkpoint.CheckpointError)) as e:
    run.run(c, str(workdir), mode=mode, **kwargs)
  message = str(e.value)
  assert "\n" not in message and "\x1b" not in message, repr(message)
  if isinstance(want, re.Pattern):
    assert want.fullmatch(message), message
  else:
    assert message == want
  after = run_files(workdir)
  changed = sorted(p for p in before.keys() | after.keys()
                   if before.get(p) != after.get(p))
  assert changed == [], f"a failed run changed {changed}"


# --- Field values validate() must reject ----------------------------------------


@pytest.mark.parametrize("field,value,message", [
    # ml_collections lets a bool into an int field (bool is an int): True
    # must not mean "1 step".
    pytest.param("train.steps", True, "config.train.steps=True: must be a"
                 " whole number >= 0; set --config.train.steps",
                 id="steps-bool"),
    pytest.param("train.steps", None, "config.train.steps=None: must be a"
                 " whole number >= 0; set --config.train.steps",
                 id="steps-none"),
    pytest.param("train.epochs", 2, "config.train.steps=30 and"
                 " config.train.epochs=2.0 both set how long to train; set"
                 " one of them to 0: --config.train.steps=0 to count in"
                 " epochs, or --config.train.epochs=0", id="steps-and-epochs"),
    pytest.param("checkpoint.keep", 0, "config.checkpoint.keep=0: must be a"
                 " whole number >= 1; set --config.checkpoint.keep",
                 id="keep-zero"),
    pytest.param("train.steps_per_loop", 0, "config.train.steps_per_loop=0:"
                 " must be a whole number >= 1; set"
                 " --config.train.steps_per_loop", id="steps-per-loop-zero"),
    pytest.param("checkpoint.every_secs", -1, "config.checkpoint.every_secs="
                 "-1.0: must be a number of seconds >= 0; set"
                 " --config.checkpoint.every_secs", id="every-secs-negative"),
    pytest.param("checkpoint.lease_secs", 0, "config.checkpoint.lease_secs=0.0:"
                 " must be a number of seconds > 0; set"
                 " --config.checkpoint.lease_secs", id="lease-secs-zero"),
    pytest.param("train.nan_recovery_tries", -1,
                 "config.train.nan_recovery_tries=-1: must be a whole number"
                 " >= 0; set --config.train.nan_recovery_tries",
                 id="nan-tries-negative"),
    pytest.param("checkpoint.best_mode", "maximum",
                 "config.checkpoint.best_mode='maximum' is not one of max,"
                 " min; did you mean 'max'? set --config.checkpoint.best_mode",
                 id="best-mode-typo"),
    pytest.param("loss_normalization", "tokens",
                 "config.loss_normalization='tokens' is not one of batch_size,"
                 " weights; set --config.loss_normalization",
                 id="normalization-unknown"),
    pytest.param("data.class_weights", (1.0, -2.0),
                 "config.data.class_weights=(1.0, -2.0): give a weight >= 0"
                 " per class id: a sequence (1.0, 5.0) or a dict {1: 5.0}",
                 id="class-weight-negative"),
    pytest.param("loss_weights", {"a": 1.0},
                 "config.loss_weights={'a': 1.0}: give {output: factor >= 0}"
                 " for outputs config.loss names (a dict by output), or None",
                 id="loss-weights-one-output"),
    pytest.param("train.early_stop_patience", 2,
                 "config.train.early_stop_patience=2: early stopping watches"
                 " checkpoint.best_metric; set --config.checkpoint.best_metric"
                 " (e.g. accuracy, val/accuracy)",
                 id="patience-without-best-metric"),
    pytest.param("data.eval_splits", "test[:50%]",
                 "config.data.eval_splits='test[:50%]' is not a dict; give"
                 " {set name: split}, e.g. {'val': 'test[:50%]', 'test':"
                 " 'test[50%:]'}", id="eval-splits-not-a-dict"),
    pytest.param("data.eval_splits", {"val/a": "test"},
                 "config.data.eval_splits names a set 'val/a': its metrics"
                 " 'val/a/<metric>' would not read back as one set's; name it"
                 " with letters, digits, '_' or '-'", id="eval-set-slash"),
    pytest.param("data.eval_splits", {"val": "test[:x]"},
                 "config.data.eval_splits['val']='test[:x]' is not a split;"
                 " write 'train', 'test[:8000]', 'test[8000:]' or"
                 " 'train[:90%]'", id="eval-set-split-syntax"),
    pytest.param("eval.monitor_set", "val",
                 "config.eval.monitor_set='val' names no eval set:"
                 " config.data.eval_splits is not set; set --config.eval."
                 "monitor_set='' or name the sets in config.data.eval_splits",
                 id="monitor-set-without-sets"),
])
def test_bad_field_value(workdir, field, value, message):
  assert_fails(config({field: value}), workdir, message)


def test_unknown_mode(workdir):
  assert_fails(config(), workdir, "mode='evaluate' is not one of train, eval,"
               " train_and_eval, continuous_eval, export; set --mode", mode="evaluate")


def test_checkpoint_flag_outside_eval_mode(workdir):
  path = workdir / "checkpoints" / "ckpt-10"
  assert_fails(config(), workdir, f"--checkpoint={path} is only read by"
               " --mode=eval and --mode=export; to start training from it set"
               " --config.init.checkpoint instead", checkpoint_path=str(path))


SETS = {"val": "test[:50%]", "test": "test[50%:]"}


def test_eval_sets_that_collide_or_name_nothing(workdir):
  assert_fails(config({"data.eval_splits": SETS,
                       "data.eval_split": "test[:10]"}), workdir,
               "config.data.eval_split='test[:10]' and config.data.eval_splits"
               " both name the eval data; set one: add it to the sets and set"
               " --config.data.eval_split=''")
  assert_fails(config({"data.eval_splits": SETS,
                       "eval.monitor_set": "valid"}), workdir,
               "config.eval.monitor_set='valid' is not one of the eval sets"
               " (test, val); set --config.eval.monitor_set")
  # A set named as an output: 'class/accuracy' would be both the set's
  # eval accuracy and the output's train accuracy.
  assert_fails(config({"loss": {"class": "sparse_categorical_crossentropy"},
                       "metrics": {"class": ("accuracy",)},
                       "data.eval_splits": {"class": "test"}}), workdir,
               "config.data.eval_splits names a set 'class', as the model's"
               " output 'class' (config.loss): its metrics 'class/<metric>'"
               " would collide with the output's train metrics; rename the"
               " set")
  # With sets, best_metric (and so early stopping) names a set's metric.
  assert_fails(config({"data.eval_splits": SETS,
                       "checkpoint.best_metric": "accuracy"}), workdir,
               "config.checkpoint.best_metric='accuracy' is not an eval"
               " metric; use one of test/loss, test/accuracy, val/loss,"
               " val/accuracy")


def by_name_only(c, split):
  """tiny's data loaded by the split's name, its slice ignored: a first
  dataset_fn as a user writes it."""
  x, y = tiny.make_data(c.model.num_examples,
                        seed={"train": 0, "test": 1}[lc.parse_split(split)[0]])
  return (x, y) if c.data.as_arrays else tf.data.Dataset.from_tensor_slices(
      (x, y))


_SLICE_IT = ("; make config.dataset_fn return only the slice, e.g."
             " x[lc.split_slice(split, len(x))[1]] (README: 'An experiment is"
             " one file')")


@pytest.mark.parametrize("fields,message", [
    pytest.param({"data.eval_splits": SETS, "data.eval_split": ""},
                 "config.data.eval_splits['test']='test[50%:]' holds 1001"
                 " examples, but that slice of the 1001 in 'test' holds 501"
                 + _SLICE_IT, id="eval-set"),
    pytest.param({"data.train_split": "train[:90%]", "data.as_arrays": True},
                 "config.data.train_split='train[:90%]' holds 1001 examples,"
                 " but that slice of the 1001 in 'train' holds 901" +
                 _SLICE_IT, id="train-arrays"),
])
def test_a_slice_dataset_fn_did_not_take(workdir, fields, message):
  """A split named with a slice holds that slice's count of its split's
  examples, or the run is refused naming the field (tiny slices right:
  every other test with slices passes the check)."""
  c = config(fields)
  c.dataset_fn = by_name_only
  assert_fails(c, workdir, message)


def test_a_train_split_smaller_than_an_update_is_one_warning(workdir, caplog):
  """512 examples under a batch of 1024 would train on repeated examples
  without a word: one warning line before training, nothing refused."""
  caplog.set_level(logging.WARNING, logger="absl")
  before = run_files(workdir)
  run.Run(config({"data.train_split": "train[:24]",
                  "train.grad_accum_steps": 2}), str(workdir), "train")
  assert [r.getMessage() for r in caplog.records] == [
      "config.data.train_split='train[:24]' holds 24 examples, fewer than one"
      " update's 64 (train.batch_size=32 x train.grad_accum_steps=2): every"
      " update repeats examples; lower --config.train.batch_size or widen"
      " the split"]
  assert run_files(workdir) == before
  caplog.clear()
  run.Run(config({"data.train_split": "train[:64]",
                  "train.grad_accum_steps": 2}), str(workdir), "train")
  assert not caplog.records


def test_unknown_loss_and_metric_names(workdir):
  # Caught by validate, before TensorFlow builds anything.
  assert_fails(config({"loss": "sparse_categorical_crosentropy"}), workdir,
               "config.loss='sparse_categorical_crosentropy' is not one of"
               " sparse_categorical_crossentropy, mean_squared_error; did you"
               " mean 'sparse_categorical_crossentropy'? set --config.loss,"
               " or assign a fn(labels, logits) in get_config()")
  assert_fails(config({"metrics": ("acuracy",)}), workdir,
               "config.metrics='acuracy' is not one of accuracy,"
               " top5_accuracy, mean_squared_error; did you mean 'accuracy'?"
               " set --config.metrics, or add a metric factory in"
               " get_config()")


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
  assert lines[-1] == (
      f"looper: --config={config_file}: loading the config file raised"
      f" {raised.value!r}; see the traceback above")
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
_PAIRS = ("yield (inputs, label) pairs or (inputs, label, sample_weight)"
          " triples, e.g. Dataset.from_tensor_slices((x, y))")
_WEIGHTS = ("config.dataset_fn yields a sample weight of {} in split 'train';"
            " weights must be finite and >= 0 (0 leaves an example out)")


def _labels(split, problem):
  return f"config.dataset_fn yields labels for split {split!r} {problem}"


def _rejected(split):
  """looper's line around Keras' own words on 5 features for 8 (those are
  Keras' to change, so any one line of them passes)."""
  return re.compile(
      r"config\.model_fn: the model rejects the examples of split"
      rf" '{split}' \(inputs \(\[5\], 'float32'\)\): [^\n]+;"
      r" make the model's Input match what config\.dataset_fn yields")


_FLOAT = "of dtype float32; class ids must be integers: tf.cast(label," \
         " tf.int32) in dataset_fn (or use another config.loss)"
_ONE_HOT = "of shape [4] each; give one class id per example (shape []): not" \
           " one-hot, not [1]"
_RANGE = ", but the model has 4 outputs; class ids must lie in [0, 4): widen" \
         " the model's last layer or fix the labels"


@pytest.mark.parametrize("change,message", [
    pytest.param(lambda x, y: (x, y, y, y),
                 f"config.dataset_fn yields ({_SPEC_8}, {_SPEC_ID},"
                 f" {_SPEC_ID}, {_SPEC_ID}) for split 'train'; {_PAIRS}",
                 id="4-tuples"),
    pytest.param(lambda x, y: (x, y, y),
                 "config.dataset_fn yields sample weights of dtype int32 for"
                 " split 'train'; make the third element of each example a"
                 " float (tf.cast(weight, tf.float32))", id="int-weights"),
    pytest.param(lambda x, y: (x, y, np.where(y == 2, -0.5, 1.0).astype(
        np.float32)), _WEIGHTS.format(-0.5), id="negative-weight"),
    pytest.param(lambda x, y: (x, y, np.where(y == 2, np.nan, 1.0).astype(
        np.float32)), _WEIGHTS.format("nan"), id="nan-weight"),
    pytest.param(lambda x, y: (x, y, np.ones([len(y), 3], np.float32)),
                 "config.dataset_fn yields sample weights of shape [3] per"
                 " example for split 'train', but the loss has shape [] per"
                 " example; give one weight per example (shape []) or one per"
                 " loss value ([])", id="weights-per-class"),
    pytest.param(lambda x, y: {"x": x, "y": y},
                 f"config.dataset_fn yields {{'x': {_SPEC_8}, 'y': {_SPEC_ID}}}"
                 f" for split 'train'; {_PAIRS}", id="dict"),
    pytest.param(lambda x, y: (x, y.astype(np.float32)),
                 _labels("train", _FLOAT), id="float-labels"),
    pytest.param(lambda x, y: (x, np.eye(4, dtype=np.int32)[y]),
                 _labels("train", _ONE_HOT), id="one-hot-labels"),
    pytest.param(lambda x, y: (x, y + 1),
                 _labels("train", "up to 4 (from 1)" + _RANGE),
                 id="class-id-too-large"),
    pytest.param(lambda x, y: (x, y - 1),
                 _labels("train", "up to 2 (from -1)" + _RANGE),
                 id="class-id-negative"),
    pytest.param(lambda x, y: (x[:, :5], y), _rejected("train"),
                 id="5-features-for-8"),
])
def test_train_examples_that_do_not_fit(workdir, change, message):
  assert_fails(config({"dataset_fn": dataset_where(change)}), workdir,
               message)


@pytest.mark.parametrize("change,message", [
    pytest.param(lambda x, y: (x, y.astype(np.float32)),
                 _labels("test", _FLOAT), id="float-labels"),
    pytest.param(lambda x, y: (x, np.eye(4, dtype=np.int32)[y]),
                 _labels("test", _ONE_HOT), id="one-hot-labels"),
    pytest.param(lambda x, y: (x, y + 4),
                 _labels("test", "up to 7 (from 4)" + _RANGE),
                 id="class-id-too-large"),
    pytest.param(lambda x, y: (x[:, :5], y), _rejected("test"),
                 id="5-features-for-8"),
])
def test_eval_examples_that_do_not_fit(workdir, change, message):
  """The eval split is checked like the train split, before training."""
  c = config({"dataset_fn": dataset_where(change, splits=("test",))})
  assert_fails(c, workdir, message)


def mean_loss(labels, logits):
  """Wrong: the batch mean, where looper wants one loss per example."""
  return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True))


def test_loss_returning_a_scalar(workdir):
  assert_fails(config({"loss": mean_loss}), workdir,
               "config.loss=mean_loss returns shape [] for a batch of 8;"
               " return one loss per example (shape [batch]) or per token"
               " ([batch, ...]): looper averages over the global batch"
               " itself")


def test_class_weights_missing_a_class(workdir):
  assert_fails(config({"data.class_weights": (1.0, 2.0)}), workdir,
               "config.data.class_weights has 2 weights, but split 'train'"
               " has class id 3; give a weight for every class id (a dict"
               " leaves the others at 1)")


def _heads(fields):
  """tiny's data (labels: class ids) under weighted's two-head model."""
  from tests.fixtures import weighted  # pylint: disable=g-import-not-at-top
  c = config({"model_fn": weighted.model_fn, "metrics": ()})
  c.model.kind = "heads"
  return configured(c, fields)


def test_outputs_and_losses_that_do_not_match(workdir):
  assert_fails(_heads({}), workdir,
               "config.loss='sparse_categorical_crossentropy': the model"
               " returns a dict of outputs ['class', 'value']; give a dict of"
               " losses by output, e.g. config.loss = {'class':"
               " 'sparse_categorical_crossentropy', ...}")
  assert_fails(_heads({"loss": {"klass": "sparse_categorical_crossentropy"}}),
               workdir, "config.loss names output 'klass', which the model"
               " does not return (its outputs: class, value); name outputs"
               " the model returns")
  assert_fails(_heads({"loss": {"class": "sparse_categorical_crossentropy"}}),
               workdir, "config.dataset_fn yields labels for split 'train'"
               " without 'class'; a model with a dict of outputs needs a dict"
               " of labels with a key for each output config.loss names"
               " (class)")


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
  with pytest.raises(lc.ConfigError) as e:
    run.run(c, str(tmp_path / "run"), mode="train")
  assert str(e.value) == (
      f"config.data.dir='{nowhere}' ({nowhere}) has no MNIST 'train' files"
      " (the directory does not exist): expected train-images-idx3-ubyte[.gz]"
      " and train-labels-idx1-ubyte[.gz], or mnist.npz; point"
      " --config.data.dir at the folder holding them")
  assert not (tmp_path / "run").exists()


# --- Workdirs and checkpoints -------------------------------------------------


def test_best_metric_that_is_not_an_eval_metric(workdir):
  assert_fails(config({"checkpoint.best_metric": "acc"}), workdir,
               "config.checkpoint.best_metric='acc' is not an eval metric;"
               " use one of loss, accuracy")


def test_workdir_holding_a_different_model(workdir):
  newest = workdir / "checkpoints" / "ckpt-20"
  assert_fails(config({"model.width": 32}), workdir, re.compile(
      rf"{re.escape(str(newest))} holds a different model or trainer state"
      r" than the config builds \([^\n]+\); use a new --workdir, or delete"
      rf" {re.escape(str(workdir))} to start over"))


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
  assert re.fullmatch(
      rf"Checkpoint {re.escape(str(newest))} cannot be read \(.+\); falling"
      rf" back to {re.escape(str(older))}\. Delete {re.escape(str(newest))}"
      r"\.\* to silence this\.", warnings[0]), warnings[0]
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
  assert_fails(config(), workdir, re.compile(
      rf"checkpoint {re.escape(str(only))} cannot be read \([^\n]+\);"
      rf" delete {re.escape(str(only))}\.\* \(and its line in"
      rf" {re.escape(str(ckpts))}/checkpoint\) or use a new --workdir"))


# --- Through the command line: one line, no traceback -------------------------


def test_eval_of_a_checkpoint_that_does_not_exist(workdir):
  missing = workdir / "checkpoints" / "ckpt-15"
  assert_fails(config(), workdir,
               f"--checkpoint={missing}: no such checkpoint ({missing}.index"
               f" is missing); give a prefix like"
               f" {workdir}/checkpoints/ckpt-1000",
               mode="eval", checkpoint_path=str(missing))


def test_workdir_under_a_regular_file(tmp_path):
  """Root ignores chmod, so the unwritable workdir is one under a file."""
  afile = tmp_path / "afile"
  afile.write_text("not a directory")
  workdir = afile / "run"
  with pytest.raises(lc.ConfigError) as e:
    run.run(config({"train.steps": 3}), str(workdir))
  assert str(e.value) == (
      f"--workdir={workdir} is not a writable directory ({afile} is"
      " not a directory); choose another --workdir")
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
  assert re.fullmatch(
      r"config\.data\.train_split='train': a batch of train steps 41-50"
      r" failed \([^\n]{1,200}\); fix what dataset_fn yields there"
      r" \(looper checked the first examples only\); nothing was saved"
      r" after the last checkpoint", str(e.value)), str(e.value)
  # tiny saves every 20 steps: the state of steps 41-46 was never saved.
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")) == str(
      tmp_path / "checkpoints" / "ckpt-40")


def test_bad_data_deep_in_the_eval_split(tmp_path):
  c = configured(tiny.get_config(), dataset_fn=deep_data("test", _bad_label))
  with pytest.raises(errors.DataError) as e:
    run.run(c, str(tmp_path), mode="train_and_eval")
  assert re.fullmatch(
      r"config\.data\.eval_split='test': a batch of the evaluation at step"
      r" 20 failed \([^\n]{1,200}\); fix what dataset_fn yields there \(looper"
      r" checked the first examples only\); nothing was saved after the last"
      r" checkpoint", str(e.value)), str(e.value)
  # Evaluation runs before the save of its step: step 20 was not saved.
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")) is None


def _softmax_model(config):
  return keras.Sequential([
      keras.Input((tiny.FEATURES,)), keras.layers.Dense(16, activation="relu"),
      keras.layers.Dense(tiny.NUM_CLASSES, activation="softmax",
                         name="probabilities")])


def test_a_final_softmax_under_a_loss_on_logits(workdir):
  assert_fails(config({"model_fn": _softmax_model}), workdir,
               "config.model_fn: the model's last layer 'probabilities'"
               " applies softmax, but config.loss="
               "'sparse_categorical_crossentropy' takes logits (from_logits):"
               " it would train on squashed outputs; drop the final"
               " activation (looper's losses and metrics take logits;"
               " override Trainer.serve to serve probabilities)")

