"""Keras callbacks in a run: fit()'s calls, its early stop, kept across a restart.

The reference is Keras' own `model.fit(steps_per_execution=5)` on the same
model, data and callbacks (tests/fixtures/callbacks.py): a recording
callback sees the same calls with the same logs, EarlyStopping and
ReduceLROnPlateau act at the same epochs, and the CSVLogger files agree.
The train logs of on_epoch_end are also the event files' means, two eval
sets' figures NumPy's on their halves of the split, and a resumed run's
restored counts matter: a control that drops them cuts the rate and stops
elsewhere.
On 2 replicas and 2 workers: tests/e2e/multiworker/test_callbacks_topologies.py.
"""

import csv
import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import errors
from looper import run
from looper.options import metrics
from looper.control import callback_state
from looper.control import callbacks as callbacks_lib
from tests.fixtures import callbacks as fixture
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.events import curve, scalars

# When a run's callbacks are called (their epochs), for `build`'s refusals.
_TIMING = {"every_steps": 0, "total_steps": 1, "eval_batch_size": 8,
           "monitor": ""}


def read_csv(path) -> list[dict]:
  with open(path) as f:
    return list(csv.DictReader(f))


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
  assert [r.keys() for r in got] == [r.keys() for r in want]
  for g, w in zip(got, want):
    np.testing.assert_allclose([float(v) for v in g.values()],
                               [float(v) for v in w.values()],
                               rtol=1e-5, atol=1e-6, err_msg=str(g))


class Boom(keras.callbacks.Callback):
  """Raises in on_epoch_end of `epoch`."""

  def __init__(self, epoch):
    super().__init__()
    self.epoch = epoch

  def on_epoch_end(self, epoch, logs=None):
    if epoch == self.epoch:
      raise RuntimeError("boom")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
  """fit_like's callbacks and a Recorder: one looper run and one fit."""
  out = tmp_path_factory.mktemp("callbacks")
  runs = {}
  for name in ("looper", "fit"):
    c = configured(fixture.get_config(),
                   {"model.csv": str(out / f"{name}.csv")})
    recorder = fixture.Recorder()
    c.callbacks = [*fixture.fit_like(c), recorder]
    if name == "looper":
      result = run.run(c, str(out / "run"), verbose=False)
    else:
      result = fixture.fit(c, c.callbacks)
    runs[name] = dict(result=result, calls=recorder.calls,
                      csv=read_csv(out / f"{name}.csv"))
  runs["workdir"] = out / "run"
  return runs


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_early_stopping_and_plateau_act_at_fits_epochs(fitted):
  history = fitted["fit"]["result"]
  stopped = len(history.epoch) * 10  # epochs of eval.every_steps=10
  assert stopped < 200  # it did stop early, and not at once
  assert len(set(history.history["learning_rate"])) > 1  # and reduced
  result = fitted["looper"]["result"]
  assert result["step"] == stopped
  assert result["ended"] == (f"EarlyStopping.on_epoch_end set"
                             f" model.stop_training at step {stopped}")
  # The same epochs' logs: train (since the epoch began), learning rate
  # and validation, to float rounding.
  assert_same_rows(fitted["looper"]["csv"], fitted["fit"]["csv"])


def test_a_recording_callback_sees_fits_calls_and_logs(fitted):
  def calls(name, test_batches):
    return [c for c in fitted[name]["calls"]
            if test_batches == c[0].startswith("on_test_batch")]

  got, want = calls("looper", False), calls("fit", False)
  assert [c[:2] for c in got] == [c[:2] for c in want]
  for (method, index, logs), (_, _, fits) in zip(got, want):
    if method == "set_params":
      assert logs == fits == {"verbose": 0, "epochs": 20, "steps": 10}
    elif fits is not None:
      assert logs.keys() == fits.keys(), (method, index)
      np.testing.assert_allclose([logs[k] for k in fits], list(fits.values()),
                                 rtol=1e-5, err_msg=f"{method}{index}")
  # One eval pass is one execution: its batches 0 to 15 (1001 examples by
  # 64), not fit's 0-4, 5-9, ... of steps_per_execution.
  test_batches = calls("looper", True)
  assert [c[:2] for c in test_batches[:2]] == [("on_test_batch_begin", (0,)),
                                               ("on_test_batch_end", (15,))]
  assert len(test_batches) == 2 * fitted["looper"]["result"]["step"] // 10


def test_epoch_train_logs_are_the_event_files_means(fitted):
  """Each on_epoch_end's train logs: the mean of its 10 steps' losses and
  of its two loops' accuracies (5 steps each), as the event files hold
  them."""
  losses = curve(fitted["workdir"] / "train")
  accuracy = scalars(fitted["workdir"] / "train", "accuracy")
  epochs = [(index[0], logs) for method, index, logs
            in fitted["looper"]["calls"] if method == "on_epoch_end"]
  assert [e for e, _ in epochs] == list(range(len(losses) // 10))
  for e, logs in epochs:
    assert logs["loss"] == pytest.approx(losses[10 * e:10 * e + 10].mean(),
                                         rel=1e-6)
    assert logs["accuracy"] == pytest.approx(
        (accuracy[10 * e + 5] + accuracy[10 * e + 10]) / 2, rel=1e-6)


def test_config_json_names_the_callbacks_objects(fitted):
  saved = json.loads((fitted["workdir"] / "config.json").read_text())
  assert saved["callbacks"][1] == (
      "<unloadable: keras.src.callbacks.early_stopping:EarlyStopping("
      "monitor='val_accuracy', min_delta=0.0015, patience=2, verbose=0,"
      " mode='auto', baseline=None, restore_best_weights=False,"
      " start_from_epoch=0)>")
  assert saved["callbacks"][3].startswith(
      "<unloadable: instance of tests.fixtures.callbacks:Recorder")


def test_model_optimizer_is_not_saved_with_the_model(fitted):
  keys = [k for k, _ in tf.train.list_variables(
      str(fitted["workdir"] / "checkpoints" / "ckpt-90"))]
  assert any(k.startswith("callbacks/learning_rate_scale") for k in keys)
  assert not any(k.startswith("model/") and "optimizer" in k for k in keys)


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_a_resumed_run_keeps_the_counts_and_the_csv_rows(
    fitted, tmp_path, monkeypatch):
  # A callback raising after the CSVLogger wrote epoch 7's row, before the
  # checkpoint of its step: as a kill there. One line, ckpt-75 kept, inside
  # epoch 7 (steps 71-80), where the counts matter: EarlyStopping's best
  # is epoch 6's (its wait ends the run after epochs 7 and 8),
  # ReduceLROnPlateau's too (it halves the rate after epoch 7). Saved in
  # the background: a save holds the state of its step, not a later one.
  fields = {"checkpoint.async_save": True, "checkpoint.every_steps": 5}
  c = configured(fixture.get_config(),
                 {**fields, "model.csv": str(tmp_path / "a.csv")})
  c.callbacks = [*fixture.fit_like(c), Boom(epoch=7)]
  wd = tmp_path / "run"
  with pytest.raises(errors.ConfigError) as e:
    run.run(c, str(wd), verbose=False)
  assert str(e.value) == (
      "config.callbacks: Boom.on_epoch_end raised RuntimeError at step 80:"
      f" boom; {wd}/checkpoints/ckpt-75 is kept; fix the callback or remove"
      " it from config.callbacks")
  assert tf.train.latest_checkpoint(str(wd / "checkpoints")).endswith("-75")
  assert len(read_csv(tmp_path / "a.csv")) == 8  # epochs 0-7
  shutil.copytree(wd, tmp_path / "control")
  shutil.copy(tmp_path / "a.csv", tmp_path / "control.csv")
  # Rerun without it, from ckpt-75: epoch 7's train logs of steps 71-75 go
  # on, its row is written again, ReduceLROnPlateau's and EarlyStopping's
  # counts go on: the file is the uninterrupted run's.
  c.callbacks = fixture.fit_like(c)
  stopped = fitted["looper"]["result"]["step"]
  assert run.run(c, str(wd), verbose=False)["step"] == stopped
  want = fitted["looper"]["csv"]
  assert read_csv(tmp_path / "a.csv") == want
  # A rerun of a run a callback ended stays ended (no epoch, no row).
  again = run.run(c, str(wd), verbose=False)
  assert again["ended"].startswith("EarlyStopping.on_epoch_end")
  assert read_csv(tmp_path / "a.csv") == want
  # The control: the same rerun with the callbacks' saved counts dropped
  # (as on_train_begin leaves them) cuts the rate at another epoch and
  # does not stop where the uninterrupted run did (10 steps more given).
  monkeypatch.setattr(callback_state.State, "set_callbacks",
                      lambda state: None)
  c = configured(fixture.get_config(), {
      **fields, "model.csv": str(tmp_path / "control.csv"),
      "train.steps": stopped + 10})
  control = run.run(c, str(tmp_path / "control"), verbose=False)
  assert control["step"] != stopped
  rows = read_csv(tmp_path / "control.csv")
  assert rows[:8] == want[:8]  # before the kill
  assert rows[8]["learning_rate"] != want[8]["learning_rate"]


class StopAt(keras.callbacks.Callback):
  """Sets model.stop_training in on_train_batch_end at batch `batch`."""

  def __init__(self, batch):
    super().__init__()
    self.batch = batch

  def on_train_batch_end(self, batch, logs=None):
    if batch == self.batch:
      self.model.stop_training = True


def test_stop_training_in_a_batch_ends_there_evaluated_and_saved(tmp_path):
  c = configured(tiny.get_config(), train__steps=40, train__steps_per_loop=5)
  recorder = fixture.Recorder()
  c.callbacks = [StopAt(batch=14), recorder]  # steps 11-15: epoch 1
  result = run.run(c, str(tmp_path), verbose=False)
  assert result["step"] == 15 and result["eval"]["examples"] == 1001
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith(
      "ckpt-15")
  # As fit: the epoch (steps 1-20) is validated and ended at that step,
  # then training.
  assert [c[:2] for c in recorder.calls[-7:]] == [
      ("on_train_batch_end", (14,)), ("on_test_begin", ()),
      ("on_test_batch_begin", (0,)), ("on_test_batch_end", (15,)),
      ("on_test_end", ()), ("on_epoch_end", (0,)), ("on_train_end", ())]
  assert recorder.calls[-2][2]["val_accuracy"] == result["eval"]["accuracy"]


def test_learning_rate_scheduler_sets_each_epochs_rate(tmp_path):
  c = configured(tiny.get_config(), train__steps=30, train__steps_per_loop=5)
  c.callbacks = [keras.callbacks.LearningRateScheduler(
      lambda epoch, rate: 0.1 * 0.5 ** epoch)]
  run.run(c, str(tmp_path), "train", verbose=False)
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").open()]
  rates = {l["step"]: l["learning_rate"] for l in lines
           if "learning_rate" in l}
  # The rate the optimizer used in each loop: epoch 0 (steps 1-20: eval
  # every 20) at 0.1, epoch 1 at 0.05.
  assert rates == pytest.approx({5: 0.1, 10: 0.1, 15: 0.1, 20: 0.1,
                                 25: 0.05, 30: 0.05})


@pytest.mark.parametrize("make, line", [
    (keras.callbacks.BackupAndRestore,
     "config.callbacks[0]=BackupAndRestore: looper resumes from the"
     " workdir's last checkpoint when the same command runs again"),
    (lambda path: keras.callbacks.ModelCheckpoint(f"{path}/m.keras"),
     "config.callbacks[0]=ModelCheckpoint: looper saves checkpoints itself"),
    (lambda path: keras.callbacks.ProgbarLogger(),
     "config.callbacks[0]=ProgbarLogger: looper prints a progress line"),
    (keras.callbacks.TensorBoard,
     "config.callbacks[0]=TensorBoard: looper writes TensorBoard events"),
    (lambda path: "a callback",
     "config.callbacks[0]='a callback' is not a keras.callbacks.Callback"),
], ids=["backup", "checkpoint", "progbar", "tensorboard", "not-one"])
def test_callbacks_looper_does_itself_are_refused_in_one_line(
    make, line, tmp_path):
  c = tiny.get_config()
  c.callbacks = [make(str(tmp_path / "theirs"))]
  with pytest.raises(errors.ConfigError) as e:
    callbacks_lib.build(c, c.callbacks, model=None, optimizer=None,
                        rate_scale=None, metrics=None, chief=True, **_TIMING)
  assert str(e.value).startswith(line)
  assert str(e.value).endswith("; remove it from config.callbacks") or (
      "Callback; give Callback objects" in str(e.value))


def test_a_factory_that_raises_is_one_line():
  def broken(config):
    return [config.model.nothing]

  with pytest.raises(errors.ConfigError) as e:
    callbacks_lib.build(tiny.get_config(), broken, model=None, optimizer=None,
                        rate_scale=None, metrics=None, chief=True, **_TIMING)
  assert str(e.value) == (
      "config.callbacks: test_a_factory_that_raises_is_one_line.<locals>."
      "broken(config) raised AttributeError: \"'nothing'\"; fix it, or give"
      " config.callbacks a list")


def test_eval_sets_are_given_as_sets_and_the_monitored_one_as_val():
  logs = {"val/loss": 1.0, "val/digit/accuracy": 0.5, "val/examples": 8,
          "test/loss": 2.0, "test/examples": 9}
  assert callbacks_lib.val_logs(logs, "val") == {
      "val/loss": 1.0, "val/digit/accuracy": 0.5, "test/loss": 2.0,
      "val_loss": 1.0, "val_digit/accuracy": 0.5}
  assert callbacks_lib.val_logs({"loss": 1.0, "examples": 8}) == {
      "val_loss": 1.0}


def test_mode_auto_follows_the_monitored_metric():
  stops = [keras.callbacks.EarlyStopping(name) for name in (
      "val_accuracy", "mean_squared_error", "val_loss", "val/top5_accuracy",
      "val_unknown")]
  callback_state.resolve_modes(stops, metrics.Metrics(
      ("accuracy", "mean_squared_error", "top5_accuracy")))
  assert [s.mode for s in stops] == ["max", "min", "min", "max", "auto"]


def numpy_eval(checkpoint: str, x: np.ndarray, y: np.ndarray) -> dict:
  """tiny's MLP at `checkpoint` on (x, y) in NumPy: eval's loss (the
  cross-entropy, no L2) and accuracy."""
  saved = tf.train.load_checkpoint(checkpoint)
  w0, b0, w1, b1 = (saved.get_tensor(
      f"optimizer/_trainable_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"
  ).astype(np.float64) for i in range(4))
  logits = np.maximum(x @ w0 + b0, 0) @ w1 + b1
  top = logits.max(axis=1)
  log_z = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
  return {"loss": np.mean(log_z - logits[np.arange(len(y)), y]),
          "accuracy": np.mean(logits.argmax(axis=1) == y)}


def test_several_eval_sets_reach_on_epoch_end_and_the_monitored_is_val(
    tmp_path):
  c = configured(tiny.get_config(), train__steps=20, eval__monitor_set="test",
                 model__num_examples=1000)  # 50% is 500 examples
  c.data.eval_split = ""
  c.data.eval_splits = {"val": "test[:50%]", "test": "test[50%:]"}
  recorder = fixture.Recorder()
  c.callbacks = [recorder]
  result = run.run(c, str(tmp_path), verbose=False)
  ((_, _, tested),) = [r for r in recorder.calls if r[0] == "on_test_end"]
  ((_, _, epoch),) = [r for r in recorder.calls if r[0] == "on_epoch_end"]
  # Each set's figures: NumPy's on its half of the test split, with the
  # weights of step 20 (the evaluation's).
  x, y = tiny.make_data(1000, seed=1)
  want = {}
  for name, part in (("val", slice(None, 500)), ("test", slice(500, None))):
    got = numpy_eval(str(tmp_path / "checkpoints" / "ckpt-20"), x[part],
                     y[part])
    want.update({f"{name}/{k}": v for k, v in got.items()})
  assert result["eval"] == pytest.approx(
      {**want, "val/examples": 500, "test/examples": 500}, rel=1e-5)
  assert tested == pytest.approx({"loss": want["test/loss"],
                                  "accuracy": want["test/accuracy"]}, rel=1e-5)
  # Its train logs: the means of the event files' per-step losses and
  # per-loop accuracies (steps 1-10 and 11-20).
  losses = curve(tmp_path / "train")
  accuracy = scalars(tmp_path / "train", "accuracy")
  assert epoch == pytest.approx({
      "loss": losses.mean(), "accuracy": (accuracy[10] + accuracy[20]) / 2,
      **want, "val_loss": want["test/loss"],
      "val_accuracy": want["test/accuracy"]}, rel=1e-5)


def test_per_step_values_reach_the_logs_as_the_loss_does():
  """A train_step's values beside its loss: each an epoch's mean over its
  steps in the train logs (as the loss), kept across a restart."""
  state = callback_state.State([], tf.Variable(1.0), ["accuracy"])
  loops = [({"loss": np.array([1.0, 2.0]), "d_loss": np.array([0.5, 0.25])},
            {"accuracy": 0.5}),
           ({"loss": np.array([3.0, 4.0, 5.0]),
             "d_loss": np.array([1.0, 1.0, 1.0])}, {"accuracy": 1.0})]
  state.add(*loops[0])
  state.keep()  # what the checkpoint at this step holds
  state.load(2)  # a restart restores it
  state.add(*loops[1])
  assert state.train_logs() == pytest.approx(
      {"loss": 3.0, "d_loss": 3.75 / 5, "accuracy": 0.8})
  assert list(state.train_logs()) == ["loss", "d_loss", "accuracy"]
