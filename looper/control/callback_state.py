"""What Keras callbacks keep across a restart, and what they need of looper's model.

Synopsis (looper.control.callbacks uses it)::

    state = callback_state.State(callbacks, trainer.learning_rate_scale,
                                 ["accuracy"])
    tf.train.Checkpoint(callbacks=state.trackables(), ...)  # saved, restored
    state.load(step)            # after a restore: True if it held one
    state.set_callbacks()       # their saved attributes (SAVED)
    state.add(values, logs); state.train_logs()  # since the epoch began
    state.next_epoch(step); state.keep()         # before the step's save
    callback_state.trim_csv(csv_logger, state.epoch)  # on resume
    callback_state.resolve_modes(callbacks, trainer.train_metrics)

The state is JSON in a host string variable beside the learning-rate
scale, written after each loop's callbacks (`keep`), so the checkpoint of
a step holds it as it was at that step, whether the save is synchronous
or in the background (a tf.train.experimental.PythonState is serialized
when the background write runs, later).
"""

import json

import keras
import numpy as np
import tensorflow as tf

from looper import errors
from looper import keras_compat
from looper.workdir import files

# What survives a restart of Keras' own callbacks: the attributes saved
# with the checkpoint and set again on resume (after on_train_begin, which
# resets them). A callback of one's own names its own in `checkpointed`.
# EarlyStopping's best_weights are not saved (the whole model each loop):
# restore_best_weights restores the best epoch since the restart.
SAVED = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "best", "cooldown_counter"),
}


def _saved_names(callback) -> tuple[str, ...]:
  names = tuple(getattr(callback, "checkpointed", ()))
  for cls in type(callback).__mro__:
    if cls.__module__.startswith("keras") and cls.__name__ in SAVED:
      names += SAVED[cls.__name__]
  return names


class State:
  """The callbacks' state at a step (see module doc): `epoch` (epochs
  ended), `start` (the step the epoch began after), the train logs' sums
  over its `steps`, `last_logs` (the last epoch's, for on_train_end) and
  `ended` (why a callback ended the run)."""

  def __init__(self, callbacks: list, scale: tf.Variable,
               metric_names: list[str]):
    self._callbacks = callbacks
    self._scale = scale
    self._metrics = metric_names
    with tf.device("/cpu:0"):  # a host variable outside any strategy scope
      self._var = tf.Variable("", trainable=False, name="callbacks")
    self.load(0)

  def trackables(self) -> dict:
    return {"learning_rate_scale": self._scale, "state": self._var}

  def load(self, step: int) -> bool:
    """The state the variable holds (restored with a checkpoint), or a
    fresh one at `step`; True if a state was saved."""
    text = self._var.numpy().decode()
    saved = json.loads(text) if text else {}
    self.epoch, self.start = saved.get("epoch", 0), saved.get("start", step)
    self.steps, self.sums = saved.get("steps", 0), saved.get("sums", {})
    self.last_logs, self.ended = saved.get("last_logs"), saved.get("ended")
    self._saved = saved.get("callbacks", {})
    return bool(text)

  def set_callbacks(self) -> None:
    """Each callback's saved attributes, if it is of the class it was."""
    for i, callback in enumerate(self._callbacks):
      saved = self._saved.get(str(i))
      if saved and saved["class"] == type(callback).__name__:
        for name, value in saved["values"].items():
          setattr(callback, name, value)

  def keep(self) -> None:
    """Writes the state, the callbacks' attributes as they are now, to the
    variable (what a save now holds)."""
    self._saved = {}
    for i, callback in enumerate(self._callbacks):
      values = {n: getattr(callback, n) for n in _saved_names(callback)}
      try:
        json.dumps(values, default=_plain)
      except TypeError as e:
        raise errors.ConfigError(
            f"config.callbacks[{i}]={type(callback).__name__}: an attribute"
            f" saved with the checkpoint cannot be written as JSON ({e});"
            " keep numbers, strings, lists or dicts in those it names in"
            " `checkpointed`") from None
      if values:
        self._saved[str(i)] = {"class": type(callback).__name__,
                               "values": values}
    self._var.assign(json.dumps(dict(
        epoch=self.epoch, start=self.start, steps=self.steps, sums=self.sums,
        last_logs=self.last_logs, ended=self.ended, callbacks=self._saved),
        default=_plain))

  # --- The epoch --------------------------------------------------------------

  def add(self, values: dict[str, np.ndarray], logs: dict) -> None:
    """A loop's per-step values (the loss, what train_step adds) and logs
    (each metric over its steps)."""
    steps = len(values["loss"])
    self.steps += steps
    sums = {**{k: float(np.sum(v, dtype=np.float64))
               for k, v in values.items()},
            **{n: logs[n] * steps for n in self._metrics if n in logs}}
    for name, value in sums.items():
      self.sums[name] = self.sums.get(name, 0.0) + value

  def train_logs(self) -> dict[str, float]:
    """The per-step values (the loss, what train_step adds) and train
    metrics since the epoch began, as fit's (its metrics are reset each
    epoch): each loop's weighted by its steps, so a mean over examples
    (loss, accuracy) is exact on whole batches."""
    return {n: s / self.steps for n, s in self.sums.items()
            } if self.steps else {}

  def next_epoch(self, step: int) -> None:
    self.epoch, self.start, self.steps, self.sums = self.epoch + 1, step, 0, {}


def _plain(value):
  """A NumPy or Keras scalar as a Python number, for JSON."""
  if np.ndim(value) == 0 and hasattr(value, "dtype"):
    return np.asarray(value).item()
  raise TypeError(f"{type(value).__name__} is not JSON serializable")


def trim_csv(logger: keras.callbacks.CSVLogger, epochs: int) -> None:
  """A CSVLogger's file as it was at the checkpoint: the rows of epochs
  from `epochs` on, which a run killed after it wrote, dropped from its
  end; the resumed run appends to it (no second header)."""
  path = logger.filename
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      lines = f.read().splitlines(keepends=True)
    while len(lines) > 1 and _epoch(lines[-1], logger.sep) >= epochs:
      lines.pop()
    files.write_text(path, "".join(lines))  # replaced whole
  logger.append = True


def _epoch(line: str, separator: str) -> float:
  """A CSVLogger row's epoch (its first field); -inf for another line."""
  try:
    return int(line.split(separator, 1)[0])
  except ValueError:
    return float("-inf")


def resolve_modes(callbacks: list, metrics) -> None:
  """A monitoring callback's mode 'auto' (EarlyStopping's default) decided
  as Keras decides it for a compiled model: from the direction of the
  metric it monitors ('val_accuracy': accuracy goes up). looper's model is
  not compiled, so Keras would find no metric and raise. `metrics`: the
  train metrics (a looper.options.metrics.Metrics)."""
  for callback in callbacks:
    monitor = getattr(callback, "monitor", None)
    if getattr(callback, "mode", None) != "auto" or not isinstance(monitor,
                                                                   str):
      continue
    name = monitor.removeprefix("val_")
    for candidate in (name, name.split("/", 1)[-1]):  # '<set>/<metric>'
      if candidate.rsplit("/", 1)[-1] == "loss":
        callback.mode = "min"
      elif candidate in metrics.by_name:
        direction = keras_compat.metric_direction(
            metrics.by_name[candidate][1])
        if direction:
          callback.mode = "max" if direction == "up" else "min"
      else:
        continue
      break
