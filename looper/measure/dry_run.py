"""The input check before a run: the model and the loss on a split's first examples.

Synopsis::

    dry_run.check_inputs(trainer, input, ["train", "test"], loss=config.loss,
                         metrics=config.metrics, data=config.data)
    # or ConfigError, one line

A mismatch between `dataset_fn`, `model_fn` and the loss would otherwise
surface as a multi-page trace from inside the first train loop (or, for
float or out-of-range class ids, as silently wrong training). `run` calls
this with every split a mode reads (looper.modes.Mode.reads), before
anything is written to the workdir, so a bad experiment leaves a workdir
as it was.
"""

import keras
import tensorflow as tf

from looper import errors
from looper import keras_compat
from looper.data import batch as batch_lib
from looper.data import checks
from looper.options import keras_objects
from looper.options import losses


def check_inputs(trainer, input, splits, *, loss, metrics, data,  # pylint: disable=redefined-builtin
                 probe: int = 256, forward: int = 8) -> None:
  """Checks each of `splits` as `check_split` does."""
  for split in splits:
    check_split(trainer, input, split, loss=loss, metrics=metrics, data=data,
                probe=probe, forward=forward)


def check_split(trainer, input, split: str, *, loss, metrics, data,  # pylint: disable=redefined-builtin
                probe: int = 256, forward: int = 8) -> None:
  """Checks a split named with a slice holds that slice (`Input.check_slice`)
  and the first `probe` examples' labels and weights, and runs
  `trainer`'s model and loss eagerly on the first `forward` of them.

  Few through the model: an eager forward pass leaves its activations'
  pages with the allocator for the life of the process (the LM's 256
  windows took 0.5 GB of peak RSS; 8 take 30 MB), and shapes and dtypes
  show in any number.

  Args:
    trainer: a built `looper.train.trainer.Trainer` (its `model`, `compute_loss`).
    input: the run's `looper.data.input.Input`.
    split: a split its config names (train or eval).
    loss: config.loss.
    metrics: config.metrics.
    data: the `data` block (train_split; class_weights, checked on it).
    probe: how many examples' labels and weights to check.
    forward: how many of them to run through the model and the loss.

  Raises:
    ConfigError: one line naming what does not fit and the fix.
  """
  field = input.field(split)
  train = split == data.train_split
  if train:
    input.source(split).check(input.batch.replicas,
                              input.batch.micro_batch_size, "train.batch_size")
  examples = checks.check_nonempty(input.examples(split), split, field)
  # A slice's count ('test[:50%]'), where counting takes no pass over the
  # train data; an eval split is counted for the evaluation anyway.
  input.check_slice(split, count=not train)
  # padded_batch: examples of variable length (data.bucket) fit too.
  inputs, labels, weights = batch_lib.parts(
      next(iter(examples.padded_batch(probe))))
  inputs, few_labels = tf.nest.map_structure(lambda t: t[:forward],
                                             (inputs, labels))
  shapes = tf.nest.map_structure(lambda t: (t.shape[1:].as_list(),
                                            t.dtype.name), inputs)
  # Only what a mismatch raises becomes one line; any other error is a bug
  # in the user's code and keeps its traceback.
  mismatch = (ValueError, TypeError, tf.errors.InvalidArgumentError)
  try:
    logits = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32),
                                   trainer.model(inputs, training=False))
  except mismatch as e:
    raise errors.ConfigError(
        f"config.model_fn: the model rejects the examples of split"
        f" {split!r} (inputs {shapes}): {errors.first_line(e)}; make the"
        " model's Input match what config.dataset_fn yields") from None
  _check_outputs(loss, metrics, logits, labels, split)
  by_output = loss if isinstance(loss, dict) else {None: loss}
  for output, value in by_output.items():
    if value == "sparse_categorical_crossentropy" or isinstance(
        value, keras.losses.SparseCategoricalCrossentropy):
      checks.check_class_labels(_pick(labels, output),
                                _pick(logits, output), split,
                                keras_objects.ignore_class(value))
  if not isinstance(loss, dict):
    _check_logits_or_probabilities(trainer.model, loss, metrics)
  name = losses.display_name(loss)
  try:
    values = trainer.compute_loss(few_labels, logits)
  except mismatch as e:
    raise errors.ConfigError(
        f"config.loss={name} fails on logits of shape"
        f" {_shape(logits)} and labels of shape"
        f" {_shape(few_labels)} ({_dtype(few_labels)}):"
        f" {errors.first_line(e)}; make the labels of split {split!r} fit"
        " the loss, or choose another config.loss") from None
  batch = len(tf.nest.flatten(inputs)[0])
  for output in by_output:
    per_example = _pick(values, output)
    if output is not None:
      name = losses.display_name(loss[output])
    if per_example.shape.rank < 1 or per_example.shape[0] != batch:
      raise errors.ConfigError(
          f"config.loss={name} returns shape {per_example.shape.as_list()}"
          f" for a batch of {batch}; return one loss per example (shape"
          " [batch]) or per token ([batch, ...]): looper averages over the"
          " global batch itself")
    if weights is not None:
      _check_weights(losses.output_weights(weights, values)[output]
                     if output else weights, per_example, split)
  if weights is not None:
    keras_objects.check_ignore_unweighted(loss, "sample weights")
  if data.class_weights and train:
    ignored = keras_objects.ignore_class(loss)
    _check_class_weights(data.class_weights, labels if ignored is None
                         else tf.boolean_mask(labels, labels != ignored),
                         split)
  _check_metrics(trainer, few_labels, logits, split)


def _check_metrics(trainer, labels, logits, split: str) -> None:
  """Each metric takes the labels and the model's outputs: a metric that
  does not fit them fails here in one line, not in the first trace."""
  metrics = trainer.build_metrics()
  for name, (output, metric) in metrics.by_name.items():
    label, logit, _ = losses.of_output(output, None, labels, logits)
    try:
      metric.update_state(label, logit)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as e:
      raise errors.ConfigError(
          f"config.metrics: {name!r} fails on outputs of shape"
          f" {_shape(logit)} and labels of shape {_shape(label)} of split"
          f" {split!r}: {errors.first_line(e)}; choose a metric for this"
          " model's outputs and labels") from None


def _pick(structure, output):
  return structure if output is None else structure[output]


def _shape(structure):
  return tf.nest.map_structure(lambda t: t.shape.as_list(), structure)


def _dtype(structure):
  return tf.nest.map_structure(lambda t: t.dtype.name, structure)


def _check_outputs(loss, metrics, logits, labels, split: str) -> None:
  """A dict of outputs needs config.loss (and config.metrics) by output
  name, and labels under the same names; one output, one loss."""
  if isinstance(logits, dict) != isinstance(loss, dict):
    if isinstance(logits, dict):
      raise errors.ConfigError(
          f"config.loss={losses.display_name(loss)}: the model"
          f" returns a dict of outputs {sorted(logits)}; give a dict of"
          f" losses by output, e.g. config.loss = {{{next(iter(logits))!r}:"
          " 'sparse_categorical_crossentropy', ...}")
    raise errors.ConfigError(
        f"config.loss is a dict by output {sorted(loss)}, but the"
        " model returns one tensor; return a dict of outputs from"
        " config.model_fn, or give one loss")
  if not isinstance(logits, dict):
    return
  for field, names in (("loss", loss), ("metrics", metrics)):
    unknown = sorted(set(names) - set(logits)) if isinstance(
        names, dict) else []
    if unknown:
      raise errors.ConfigError(
          f"config.{field} names output {unknown[0]!r}, which the model does"
          f" not return (its outputs: {', '.join(sorted(logits))}); name"
          " outputs the model returns")
  missing = sorted(set(loss) - set(
      labels if isinstance(labels, dict) else ()))
  if missing:
    raise errors.ConfigError(
        f"config.dataset_fn yields labels for split {split!r} without"
        f" {missing[0]!r}; a model with a dict of outputs needs a dict of"
        f" labels with a key for each output config.loss names"
        f" ({', '.join(sorted(loss))})")


def _check_weights(weights, values, split: str) -> None:
  """Sample weights: a prefix of the loss's shape, finite and >= 0."""
  shape, loss_shape = weights.shape[1:].as_list(), values.shape[1:].as_list()
  while len(shape) > len(loss_shape) and shape[-1] == 1:
    shape = shape[:-1]
  if shape != loss_shape[:len(shape)]:
    raise errors.ConfigError(
        f"config.dataset_fn yields sample weights of shape {shape} per"
        f" example for split {split!r}, but the loss has shape {loss_shape}"
        f" per example; give one weight per example (shape []) or one per"
        f" loss value ({loss_shape})")
  bad = tf.logical_or(tf.logical_not(tf.math.is_finite(weights)),
                      weights < 0)
  if bool(tf.reduce_any(bad)):
    value = float(tf.boolean_mask(weights, bad)[0])
    raise errors.ConfigError(
        f"config.dataset_fn yields a sample weight of {value} in split"
        f" {split!r}; weights must be finite and >= 0 (0 leaves an example"
        " out)")


def _check_class_weights(class_weights, labels, split: str) -> None:
  """Every label of the probe indexes data.class_weights."""
  table = losses.class_weight_table(class_weights)
  if not labels.dtype.is_integer:
    raise errors.ConfigError(
        f"config.data.class_weights needs integer class-id labels, but"
        f" split {split!r} yields {labels.dtype.name} labels; cast them to"
        " int32 or unset --config.data.class_weights")
  high = int(tf.reduce_max(labels))
  if high >= len(table) or int(tf.reduce_min(labels)) < 0:
    raise errors.ConfigError(
        f"config.data.class_weights has {len(table)} weights, but split"
        f" {split!r} has class id {high}; give a weight for every class id"
        f" (a dict leaves the others at 1)")


def _check_logits_or_probabilities(model, loss, metrics) -> None:
  """A loss or metric reading logits behind a final softmax or sigmoid
  trains (or reports) silently wrong (Keras warns of it too); so does a
  Keras object reading probabilities (from_logits=False) behind a linear
  last layer."""
  last = keras_compat.output_operation(model)
  if last is None:
    return  # a subclassed model: its last step cannot be read
  kind = type(last).__name__.lower()  # a Softmax layer, keras.ops.sigmoid
  squash = next((s for s in ("softmax", "sigmoid") if s in kind), None) or (
      getattr(getattr(last, "activation", None), "__name__", None))
  squashed = squash in ("softmax", "sigmoid")
  objects = [m for m in metrics if keras_objects.is_metric(m)]
  for field, value in [("loss", loss)] + [("metrics", m) for m in objects]:
    reads = keras_objects.from_logits(value)
    if value in losses.FROM_LOGITS:
      reads = True
    shown = (keras_objects.describe(value) if reads is not None and
             not isinstance(value, str) else repr(value))
    if reads and squashed:
      raise errors.ConfigError(
          f"config.model_fn: the model's last layer {last.name!r} applies"
          f" {squash}, but config.{field}={shown} takes logits"
          " (from_logits): it would train on squashed outputs; drop the"
          " final activation (looper's losses and metrics take logits;"
          " override Trainer.serve to serve probabilities)")
    if reads is False and squash == "linear":  # a Lambda: cannot tell
      raise errors.ConfigError(
          f"config.{field}={shown} reads probabilities (from_logits=False),"
          f" but the model's last layer {last.name!r} returns logits (no"
          " softmax or sigmoid); pass from_logits=True to it")
