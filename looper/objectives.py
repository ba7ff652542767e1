"""What training minimizes and reports: losses and metrics by name.

Synopsis::

    c.loss = "sparse_categorical_crossentropy"   # a name from LOSSES
    c.loss = my_loss                             # or fn(labels, logits)
    c.metrics = ("accuracy", keras_metric_factory)

    loss_fn = objectives.lookup(config.loss, objectives.LOSSES, "loss")
    metrics = [objectives.lookup(m, objectives.METRICS, "metrics")()
               for m in config.metrics]
    objectives.check_metric_names([m.name for m in metrics])

Losses are per example on the model's float32 logits (looper averages
over the global batch itself); metrics are zero-argument factories of
Keras metrics updated with (labels, logits, sample_weight). A name is
checked by `config.validate` against these tables, before TensorFlow
builds anything.
"""

from typing import Any

import keras

from looper.errors import ConfigError

# Per-example losses on logits, by `config.loss` name.
LOSSES = {
    "sparse_categorical_crossentropy":
        lambda labels, logits: keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True),
    "mean_squared_error": keras.losses.mean_squared_error,
}

# The LOSSES that read logits (from_logits=True): a model ending in a
# softmax or sigmoid would feed them probabilities (see `probe`).
FROM_LOGITS = ("sparse_categorical_crossentropy",)

# Metric factories on logits, by `config.metrics` name.
METRICS = {
    "accuracy": lambda: keras.metrics.SparseCategoricalAccuracy("accuracy"),
    "top5_accuracy": lambda: keras.metrics.SparseTopKCategoricalAccuracy(
        5, name="top5_accuracy"),
    "mean_squared_error": lambda: keras.metrics.MeanSquaredError(
        "mean_squared_error"),
}

# Keys looper itself puts in the train and eval logs; a metric with one of
# these names would overwrite them (see `check_metric_names`).
RESERVED_METRIC_NAMES = ("loss", "examples", "learning_rate", "steps_per_sec",
                         "examples_per_sec", "input_wait_fraction")


def lookup(value: Any, table: dict, field: str):
  """`value` itself if it is callable, else its entry in `table`.

  `config.validate` has checked the name; this error is for a Trainer
  built from a config that was not validated.
  """
  if callable(value):
    return value
  if value not in table:
    raise ConfigError(
        f"config.{field}={value!r} is not one of {', '.join(table)}; use one"
        " of those or assign a function in get_config()")
  return table[value]


def display_name(value: Any) -> str:
  """How an error names a loss: its config name, or the function's name."""
  return repr(value) if isinstance(value, str) else getattr(
      value, "__name__", type(value).__name__)


def check_metric_names(names) -> None:
  """Checks the names of the built metric objects (they key the logs).

  Called once the metrics are built, since factories choose their names.

  Args:
    names: the `.name` of every metric, in config.metrics order.

  Raises:
    ConfigError: a name is one looper logs itself, or is used twice.
  """
  seen = set()
  for name in names:
    if name in RESERVED_METRIC_NAMES:
      raise ConfigError(
          f"config.metrics: a metric is named {name!r}, which looper reports"
          " itself; give it another name (e.g. keras.metrics.Mean("
          f"name='my_{name}'))")
    if name in seen:
      raise ConfigError(
          f"config.metrics: two metrics are named {name!r}, so one would"
          " hide the other in the logs; give each its own name")
    seen.add(name)
