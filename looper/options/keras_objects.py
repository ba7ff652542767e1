"""Keras loss and metric objects, as a Keras user writes them, in a config.

Synopsis (an experiment's get_config())::

    c.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    c.metrics = ("accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3))

    keras_objects.loss_fn(c.loss)            # fn(labels, logits) per example
    keras_objects.normalization(c.loss, c.loss_normalization)  # 'batch_size'
    keras_objects.ignore_class(c.loss)       # None, or the label to skip
    factory = keras_objects.metric_factory(metric, "metrics")  # copies

A loss object reduces to one number per replica and micro-batch; looper
needs its per-example (or per-token) values to average over the global
batch itself, so it calls the object's `call` (Keras' own unreduced
values, `from_logits` and `ignore_class` included) and maps its
`reduction` onto `config.loss_normalization` (REDUCTIONS). Its
`ignore_class` becomes a 0 weight on those labels with normalization
'weights': the mean over the labels not ignored, as Keras takes it, but
over the global batch (Keras averages each replica's own).

A metric object holds variables: looper needs fresh ones per use (train,
eval, in the strategy's scope), so it rebuilds the object from its class
and `get_config()`. The config file itself is loaded with Keras'
variables deferred (`keras_compat.keras_variables_deferred`,
looper.cli.parsing), so a metric written there creates no TensorFlow
variable before looper sets the devices up. Errors are one line naming the field and the fix.
"""

from typing import Any, Callable

import keras

from looper.errors import ConfigError

# A loss object's `reduction` -> config.loss_normalization; None: its
# values are per example already, the config's normalization applies.
# 'sum' is refused: a sum over each replica's examples changes with the
# replica count.
REDUCTIONS = {"sum_over_batch_size": "batch_size", "mean": "batch_size",
              "mean_with_sample_weight": "weights", None: None, "none": None}


def is_loss(value: Any) -> bool:
  return isinstance(value, keras.losses.Loss)


def is_metric(value: Any) -> bool:
  return isinstance(value, keras.metrics.Metric)


def describe(value: Any) -> str:
  """'SparseCategoricalCrossentropy(from_logits=True)': the class and the
  settings an error needs (not its name or dtype)."""
  config = value.get_config()
  shown = {k: v for k, v in config.items() if k not in ("name", "dtype")}
  args = ", ".join(f"{k}={v!r}" for k, v in shown.items())
  return f"{type(value).__name__}({args})"


def loss_fn(loss: keras.losses.Loss) -> Callable:
  """The loss object's unreduced values: fn(labels, logits)."""
  return loss.call


def _losses(spec) -> list[tuple[str, Any]]:
  """(field, value) of config.loss: one, or one per output."""
  if isinstance(spec, dict):
    return [(f"loss['{k}']", v) for k, v in spec.items()]
  return [("loss", spec)]


def check_loss(spec, configured: str, class_weighted: bool = False) -> None:
  """Raises ConfigError (one line) for loss objects looper cannot run as
  written: a 'sum' (or unknown) reduction, reductions that disagree with
  each other or with config.loss_normalization, ignore_class per output or
  beside data.class_weights (`class_weighted`) under Keras' default."""
  normalization(spec, configured)
  if class_weighted:
    check_ignore_unweighted(spec, "data.class_weights")
  outputs = isinstance(spec, dict)
  for field, value in _losses(spec):
    if outputs and is_loss(value) and _setting(value, "ignore_class") is not None:
      raise ConfigError(
          f"config.{field}={describe(value)}: ignore_class works on one"
          " output only; weigh the examples of each output by a third"
          " element per example (a dict of weights by output) instead")


def normalization(spec, configured: str) -> str:
  """The run's loss normalization: config.loss_normalization (`configured`),
  or what its loss objects' reduction and ignore_class say.

  Raises:
    ConfigError: a reduction looper cannot keep, or two that disagree.
  """
  said = {}  # normalization -> the field that asked for it
  for field, value in _losses(spec):
    if not is_loss(value):
      continue
    reduction = value.reduction
    if reduction not in REDUCTIONS:
      raise ConfigError(
          f"config.{field}={describe(value)}: looper averages each update's"
          " losses over the global batch itself, which a reduction"
          f" {reduction!r} would not give; pass"
          " reduction='sum_over_batch_size' (Keras' default) or"
          " 'mean_with_sample_weight' to the loss")
    wanted = ("weights" if _setting(value, "ignore_class") is not None
              else REDUCTIONS[reduction])
    if wanted:
      said.setdefault(wanted, field)
  if len(said) > 1:
    raise ConfigError(
        f"config.{said['batch_size']} and config.{said['weights']} average"
        " their losses differently (reduction or ignore_class); give every"
        " output's loss one reduction")
  if not said:
    return configured
  wanted, field = next(iter(said.items()))
  # 'batch_size' is the default: a loss object's reduction overrides it.
  if configured not in ("batch_size", wanted):
    raise ConfigError(
        f"config.loss_normalization={configured!r}, but"
        f" config.{field}={describe(_dict_or(spec, field))} averages by"
        f" {wanted!r}; drop one: leave loss_normalization at 'batch_size',"
        " or pass reduction=None to the loss")
  return wanted


def check_ignore_unweighted(spec, weights: str) -> None:
  """ignore_class with `weights` (sample or class weights) under Keras'
  default reduction: Keras divides the weighted sum by the number of
  labels kept, an average none of looper's normalizations is; one line."""
  if (ignore_class(spec) is not None and
      REDUCTIONS.get(spec.reduction) == "batch_size"):
    raise ConfigError(
        f"config.loss={describe(spec)} with {weights}: Keras would divide"
        " the weighted sum by the number of labels not ignored, which"
        " looper does not; pass reduction='mean_with_sample_weight' (the"
        " weighted mean over the labels not ignored) to the loss, or drop"
        " the weights")


def _dict_or(spec, field: str):
  return spec if not isinstance(spec, dict) else spec[field[6:-2]]


def ignore_class(spec) -> int | None:
  """The label a (single) loss object ignores, or None."""
  if isinstance(spec, dict) or not is_loss(spec):
    return None
  return _setting(spec, "ignore_class")


def _setting(value, key: str):
  return value.get_config().get(key)


def from_logits(value) -> bool | None:
  """What a Keras loss or metric object reads: True logits, False
  probabilities, None if it has no such setting."""
  if not (is_loss(value) or is_metric(value)):
    return None
  return _setting(value, "from_logits")


def metric_factory(metric: keras.metrics.Metric, field: str) -> Callable:
  """A zero-argument factory of fresh copies of `metric` (its class and
  get_config()); a copy that cannot be made (a subclass whose get_config()
  misses an argument of its __init__) is one ConfigError naming `field`.
  `config.validate` builds one with Keras' variables deferred, so this
  fails before the devices are set."""
  cls, config = type(metric), metric.get_config()

  def copy():
    try:
      return cls.from_config(config)
    except (TypeError, ValueError) as e:
      raise ConfigError(
          f"config.{field}: {cls.__name__} cannot be rebuilt from its"
          f" get_config() ({str(e).splitlines()[0]}); give a zero-argument"
          f" factory instead, e.g. lambda: {cls.__name__}(...)") from None

  return copy
