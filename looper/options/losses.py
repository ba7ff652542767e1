"""What training minimizes: losses by name, and their average over a global batch.

Synopsis::

    c.loss = "sparse_categorical_crossentropy"   # a name from LOSSES
    c.loss = my_loss                             # or fn(labels, logits)
    c.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    c.loss_normalization = "batch_size"          # or "weights": NORMALIZATIONS
    # A model returning a dict of outputs (labels: a dict, same keys):
    c.loss = {"digit": "sparse_categorical_crossentropy",
              "ink": "mean_squared_error"}
    c.loss_weights = {"digit": 1.0, "ink": 0.5}

    fns = losses.losses(config.loss)              # a fn, or a dict of fns
    values = losses.apply(fns, labels, logits)    # per example/token
    loss = losses.average(values, weights, weight_total, loss_weights=
                          config.loss_weights, normalization=normalization,
                          global_batch_size=256)
    eval_loss = losses.EvalLoss(config.loss, normalization,
                                config.loss_weights)  # a whole split's

Losses are per example (shape [batch]) or per token (any [batch, ...]) on
the model's float32 logits: looper averages over the global batch itself,
so the update is the same on any number of replicas. The average
(`config.loss_normalization`, defined once here and in BUILD.md "Losses"):

    batch_size  sum(w * loss) / (number of loss values in the global batch)
                Keras' rule (reduction 'sum_over_batch_size'); w = 1 if the
                examples carry no weight.
    weights     sum(w * loss) / sum(w): a weighted mean (w broadcast to the
                loss's shape); for per-token losses with a 0/1 mask, the
                mean over the real tokens of the global batch.

Both sums run over the whole update: every replica and every
micro-batch of train.grad_accum_steps. Keras loss objects run
as Keras computes them, their reduction mapped onto the normalization
(looper.options.keras_objects). The top-level fields `loss`,
`loss_weights` and `loss_normalization` are declared here (`config()`)
and checked here (`check`: a name against these tables), before
TensorFlow builds anything.
"""

import math
from typing import Any

import keras
import ml_collections
import tensorflow as tf

from looper import autograph
from looper import fields
from looper.errors import ConfigError
from looper.options import keras_objects


# Per-example losses on logits, by `config.loss` name.
LOSSES = {
    "sparse_categorical_crossentropy":
        lambda labels, logits: keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True),
    "mean_squared_error": keras.losses.mean_squared_error,
}

# LOSSES reading logits: a final softmax or sigmoid is refused (`dry_run`).
FROM_LOGITS = ("sparse_categorical_crossentropy",)

# config.loss_normalization -> the denominator of the global batch's loss,
# from (count: loss values in the global batch, weight_sum: the sum of the
# weights broadcast to them, or None if the examples carry none).
NORMALIZATIONS = {
    "batch_size": lambda count, weight_sum: count,
    "weights": lambda count, weight_sum: (
        count if weight_sum is None else weight_sum),
}

def config() -> ml_collections.ConfigDict:
  """The top-level fields of the loss: each default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # Per-example (or per-token) loss on the model's logits: a name
  # (losses.LOSSES) or fn(labels, logits); for a model returning a dict
  # of outputs, a dict of them by output (labels: a dict, same keys).
  c.loss = fields.object_field("sparse_categorical_crossentropy")
  # Outputs: {output: factor} in the sum of their losses (missing: 1).
  c.loss_weights = fields.object_field(None)
  # How the global batch's weighted losses are averaged (losses.NORMALIZATIONS):
  # batch_size (Keras': by the number of loss values) | weights (by the sum
  # of the weights: masked per-token losses average over the real tokens).
  c.loss_normalization = "batch_size"
  return c


def check(loss, loss_weights, normalization: str, *,
          class_weighted: bool = False) -> None:
  """config.loss (names from LOSSES, or functions; a dict by output),
  loss_weights and loss_normalization; `class_weighted`: whether
  data.class_weights is set (keras_objects.check_loss). ConfigError on the
  first bad one."""
  outputs = isinstance(loss, dict)
  for output, value in (loss.items() if outputs else [(None, loss)]):
    name = "loss" if output is None else f"loss['{output}']"
    fields.check(callable(value) or isinstance(value, str), name, value,
                 "give a loss name or a fn(labels, logits) -> per-example"
                 " loss (or a dict of them by output name)")
    if isinstance(value, str):
      fields.check_choice(value, name, LOSSES,
                          ", or assign a fn(labels, logits) in get_config()")
  if loss_weights is not None:
    fields.check(
        outputs and isinstance(loss_weights, dict) and
        set(loss_weights) <= set(loss) and
        all(fields.number(v) and v >= 0 for v in loss_weights.values()),
        "loss_weights", loss_weights, "give {output: factor >= 0} for outputs"
        " config.loss names (a dict by output), or None")
  fields.check_choice(normalization, "loss_normalization", NORMALIZATIONS)
  keras_objects.check_loss(loss, normalization, class_weighted=class_weighted)


def lookup(value: Any, table: dict, field: str):
  """`value` itself if it is callable, else its entry in `table` (the error
  is for a Trainer built from a config `config.validate` did not check)."""
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


class LossMean(keras.metrics.Metric):
  """An output's loss over a whole (eval) split, averaged as training
  averages a global batch: sum(w * loss) over the split's real examples
  divided by the config.loss_normalization denominator over them."""

  def __init__(self, normalization: str, name: str = "loss"):
    super().__init__(name=name)
    self.normalization = normalization
    self.total = self.add_variable(shape=(), initializer="zeros",
                                   name="total")
    self.denominator = self.add_variable(shape=(), initializer="zeros",
                                         name="denominator")

  def update_state(self, values, weights, mask):
    """values [batch, ...]; weights None or a prefix shape; mask [batch]
    (0 for eval padding)."""
    weighted_mask = masked(weights, mask)
    ones = tf.ones_like(values)
    self.total.assign_add(tf.reduce_sum(
        values * broadcast(weighted_mask, values)))
    count = tf.reduce_sum(ones * broadcast(mask, values))
    weight_sum = None if weights is None else tf.reduce_sum(
        ones * broadcast(weighted_mask, values))
    self.denominator.assign_add(
        NORMALIZATIONS[self.normalization](count, weight_sum))

  def result(self):
    return tf.math.divide_no_nan(self.total, self.denominator)


class EvalLoss:
  """The loss over a whole eval split, averaged as training averages a
  global batch: each output's LossMean (logged 'loss', or 'output/loss' and
  their loss_weights total 'loss') and the real examples counted
  ('examples'). Built in strategy scope; updated in the replica step.

  Args:
    loss: config.loss (a dict of them by output: one mean each).
    normalization: config.loss_normalization.
    loss_weights: config.loss_weights (outputs' factors in the total).
  """

  def __init__(self, loss, normalization: str, loss_weights=None):
    outputs = list(loss) if isinstance(loss, dict) else [None]
    # output name (None: the model's one output) -> its mean
    self._means = {k: LossMean(normalization,
                               "loss" if k is None else f"{k}/loss")
                   for k in outputs}
    self._loss_weights = loss_weights
    # float64 counts stay exact far beyond float32's 2**24 examples.
    self._examples = keras.metrics.Sum("examples", dtype="float64")

  @property
  def output_names(self) -> list[str]:
    """'output/loss' for each output of a dict; [] for one output."""
    return [m.name for k, m in self._means.items() if k is not None]

  def update(self, values, weights, mask) -> None:
    """values: what compute_loss returned; weights: the examples' (None or
    a prefix shape); mask [batch]: 0 for eval padding."""
    for output, mean in self._means.items():
      mean.update_state(*of_output(output, weights, values), mask)
    self._examples.update_state(mask)

  def reset(self) -> None:
    for metric in [*self._means.values(), self._examples]:
      metric.reset_state()

  def results(self) -> dict:
    """'loss', each 'output/loss' (a dict of outputs) and 'examples'."""
    losses = {k: m.result() for k, m in self._means.items()}
    if None in losses:
      return {"loss": losses[None], "examples": self._examples.result()}
    return {"loss": combined(losses, self._loss_weights),  # as in training
            **{self._means[k].name: v for k, v in losses.items()},
            "examples": self._examples.result()}


def losses(value: Any):
  """config.loss as functions: one fn(labels, logits), or a dict of them by
  output name (a model returning a dict of outputs)."""
  if isinstance(value, dict):
    return {k: _loss_fn(v, f"loss['{k}']") for k, v in value.items()}
  return _loss_fn(value, "loss")


def _loss_fn(value, field: str):
  # A function of the user's may branch on tensors: AutoGraph converts it.
  if keras_objects.is_loss(value):  # its unreduced values
    return autograph.user(keras_objects.loss_fn(value), f"config.{field}")
  return (autograph.user(value, f"config.{field}") if callable(value)
          else lookup(value, LOSSES, field))


def apply(loss_fns, labels, logits):
  """Per-example (or per-token) loss values: a tensor, or (`loss_fns` a
  dict by output) a dict of them, from the labels and logits of each."""
  if isinstance(loss_fns, dict):
    return {k: _loss(fn, labels[k], logits[k]) for k, fn in loss_fns.items()}
  return _loss(loss_fns, labels, logits)


def _loss(fn, labels, logits):
  return tf.cast(fn(labels, logits), tf.float32)


def of_output(output, weights, *trees) -> tuple:
  """`output`'s part of each tree (a tensor, or a dict by output) and of
  the weights, last; output None (one output): the trees as they are."""
  if output is None:
    return (*trees, weights)
  return (*(t[output] for t in trees),
          output_weights(weights, trees[-1])[output])


def output_weights(weights, values):
  """The example weights of each output: `weights` as given if they are a
  dict by output, else the same weights for every output."""
  if isinstance(values, dict):
    return {k: weights[k] if isinstance(weights, dict) else weights
            for k in values}
  return weights


def broadcast(weights, values) -> tf.Tensor:
  """`weights` (shape [batch] or a prefix of the loss's shape) expanded to
  broadcast against `values`; a trailing size-1 axis beyond it is dropped
  ([batch, 1] weights on [batch] losses, as Keras accepts)."""
  weights = tf.cast(weights, values.dtype)
  while weights.shape.rank > values.shape.rank and weights.shape[-1] == 1:
    weights = tf.squeeze(weights, -1)
  for _ in range(values.shape.rank - weights.shape.rank):
    weights = weights[..., tf.newaxis]
  return weights


def values_per_weight(weights, values) -> int:
  """Loss values one weight covers: 1 for weights shaped like the losses,
  the tokens of an example for per-example weights on per-token losses."""
  return math.prod(values.shape[1:]) // math.prod(
      broadcast(weights, values).shape[1:])


def combined(per_output: dict, loss_weights) -> tf.Tensor:
  """The model's loss from its outputs': sum of loss_weights[k] * loss_k
  (a missing factor is 1)."""
  return tf.add_n([(loss_weights or {}).get(k, 1.0) * loss
                   for k, loss in per_output.items()])


def average(values, weights=None, weight_total=None, *, loss_weights=None,
            normalization: str = "batch_size", global_batch_size: int):
  """This batch's share of the global batch's loss (see the module doc).

  Args:
    values: per-example or per-token losses [batch, ...], or a dict of them
      by output.
    weights: the examples' weights (None: 1), shaped like a prefix of the
      values (or a dict by output).
    weight_total: the sum of `weights` over the global batch (every replica
      and micro-batch), as `sum(weights)` computes it; needed by
      normalization 'weights' only. A dict by output if `weights` is one.
    loss_weights: a dict of a factor per output (missing: 1).
    normalization: a key of NORMALIZATIONS.
    global_batch_size: examples in the global batch (of one update).

  Returns:
    A float32 scalar; summed over the replicas and micro-batches of one
    update it is the global batch's loss.
  """
  if isinstance(values, dict):
    weights = output_weights(weights, values)
    totals = output_weights(weight_total, values)
    return combined({k: average(v, weights[k], totals[k],
                                normalization=normalization,
                                global_batch_size=global_batch_size)
                     for k, v in values.items()}, loss_weights)
  weighted = values if weights is None else values * broadcast(weights,
                                                               values)
  count = global_batch_size * math.prod(values.shape[1:])
  weight_sum = None if weight_total is None else (
      tf.cast(weight_total, tf.float32) * values_per_weight(weights, values))
  denominator = NORMALIZATIONS[normalization](count, weight_sum)
  return tf.math.divide_no_nan(tf.reduce_sum(weighted),
                               tf.cast(denominator, tf.float32))


def masked(weights, mask):
  """Eval weights: the examples' weights (None: 1) times the padding mask
  [batch], per output if the weights are a dict."""
  if weights is None:
    return mask
  return tf.nest.map_structure(
      lambda w: broadcast(mask, w) * tf.cast(w, tf.float32), weights)


def class_weight_table(value) -> tf.Tensor | None:
  """data.class_weights (a sequence by class id, or a dict {id: weight};
  a class a dict leaves out weighs 1) as a float32 vector; None if unset."""
  if not value:
    return None
  if isinstance(value, dict):
    value = {int(k): float(v) for k, v in value.items()}
    value = [value.get(i, 1.0) for i in range(max(value) + 1)]
  return tf.constant([float(v) for v in value], tf.float32)


def label_weighted(weights, labels, table=None, ignored: int | None = None):
  """`weights` (None: 1) times each label's class weight (`table`, from
  class_weight_table; an ignored label, maybe -100, is looked up as 0) and
  0 where the label is `ignored` (a Keras loss object's ignore_class)."""
  ids = labels if ignored is None else tf.where(labels == ignored, 0, labels)
  factors = [] if table is None else [tf.gather(table, ids)]
  if ignored is not None:
    factors.append(tf.cast(tf.not_equal(labels, ignored), tf.float32))
  for f in factors:
    weights = f if weights is None else f * broadcast(weights, f)
  return weights
