"""What training reports: metrics by name, built fresh per use, keyed by log name.

Synopsis::

    c.metrics = ("accuracy", keras.metrics.AUC(), keras_metric_factory)
    # A model returning a dict of outputs: metrics per output, logged as
    # 'digit/accuracy', 'ink/mean_squared_error'.
    c.metrics = {"digit": ("accuracy",), "ink": ("mean_squared_error",)}

    train = metrics.Metrics(config.metrics)      # in strategy scope
    train.update(labels, logits, weights)        # in a replica step
    train.results()                              # {'accuracy': ...}

Metrics are names (METRICS), zero-argument factories of Keras metrics, or
Keras metric objects (rebuilt fresh per use from their class and
`get_config()`: looper.options.keras_objects), updated with (labels,
logits, sample_weight) on the model's float32 logits. The top-level field
`metrics` is declared here (`config()`) and checked here (`check`: a name
against METRICS), before TensorFlow builds anything.
"""

from typing import Any

import keras
import ml_collections

from looper import fields
from looper import keras_compat
from looper.errors import ConfigError
from looper.options import keras_objects
from looper.options import losses


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
                         "examples_per_sec", "tokens_per_sec", "flops_per_sec",
                         "mfu", "tokens", "flops", "input_wait_fraction",
                         "grad_norm", "grad_norm_max", "weight_norm",
                         "update_ratio")


def config() -> ml_collections.ConfigDict:
  """The top-level field `metrics`: its default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # Metrics on logits, by name (metrics.METRICS) or zero-arg factories;
  # for outputs, a dict of such tuples by output (logged 'output/name').
  c.metrics = fields.object_field(("accuracy",))
  return c


def check(spec, *, outputs: bool = False) -> None:
  """config.metrics (`spec`): a tuple of names (METRICS) or factories, a
  dict of them by output if `outputs` (config.loss is a dict by output).
  ConfigError on the first bad one."""
  fields.check(isinstance(spec, dict) == outputs or not spec, "metrics",
               spec, "give a dict of metric tuples by output when config.loss"
               " is a dict by output, else a tuple" if outputs else
               "give a tuple of metric names, e.g. ('accuracy',): config.loss"
               " is not a dict by output")
  for output, entries in (spec.items() if isinstance(spec, dict)
                          else [(None, spec)]):
    name = "metrics" if output is None else f"metrics['{output}']"
    fields.check(isinstance(entries, (tuple, list)), name, entries,
                 "give a tuple of metric names, e.g. ('accuracy',)")
    for metric in entries:
      fields.check(callable(metric) or isinstance(metric, str), name, entries,
                   "give metric names, Keras metric objects or zero-argument"
                   " factories of them")
      if isinstance(metric, str):
        fields.check_choice(metric, name, METRICS,
                            ", or add a metric factory in get_config()")
  # Built once here, their variables never made: what they log under,
  # and that each object rebuilds from its config (looper makes fresh
  # copies), fail now, not in the first trace.
  with keras_compat.keras_variables_deferred():
    Metrics(spec)


class Metrics:
  """The experiment's metrics, keyed by the name they log under.

  Args:
    spec: config.metrics: a tuple of names or factories, or (a model with a
      dict of outputs) a dict of such tuples by output name, whose metrics
      log as 'output/name'.

  Raises:
    ConfigError: an unknown name, or two metrics logging under one name.
  """

  def __init__(self, spec):
    per_output = spec.items() if isinstance(spec, dict) else [(None, spec)]
    built = [(output, factory(value, "metrics" if output is None
                              else f"metrics['{output}']")())
             for output, values in per_output for value in values]
    names = [m.name if o is None else f"{o}/{m.name}" for o, m in built]
    check_metric_names(names)
    # log name -> (output name or None, Keras metric)
    self.by_name = dict(zip(names, built))

  @property
  def names(self) -> list[str]:
    return list(self.by_name)

  def update(self, labels, logits, weights=None) -> None:
    for output, metric in self.by_name.values():
      *parts, sample_weight = losses.of_output(output, weights, labels, logits)
      metric.update_state(*parts, sample_weight=sample_weight)

  def reset(self) -> None:
    for _, metric in self.by_name.values():
      metric.reset_state()

  def results(self) -> dict:
    return {name: metric.result()
            for name, (_, metric) in self.by_name.items()}


def factory(metric, field: str = "metrics") -> Any:
  """config.metrics' entry (at `field`) as a zero-argument factory."""
  if keras_objects.is_metric(metric):
    return keras_objects.metric_factory(metric, field)
  return losses.lookup(metric, METRICS, "metrics")


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
    if name.rsplit("/", 1)[-1] in RESERVED_METRIC_NAMES:  # 'out/loss' too
      raise ConfigError(
          f"config.metrics: a metric is named {name!r}, which looper reports"
          " itself; give it another name (e.g. keras.metrics.Mean("
          f"name='my_{name}'))")
    if name in seen:
      raise ConfigError(
          f"config.metrics: two metrics are named {name!r}, so one would"
          " hide the other in the logs; give each its own name")
    seen.add(name)
