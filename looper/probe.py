"""The input check before a run: the model and the loss on a split's first examples.

Synopsis::

    probe.check_inputs(trainer, config.data.train_split)  # or ConfigError

A mismatch between `dataset_fn`, `model_fn` and the loss would otherwise
surface as a multi-page trace from inside the first train loop (or, for
float or out-of-range class ids, as silently wrong training). `run` calls
this for every split a mode reads, before anything is written to the
workdir, so a bad experiment leaves a workdir as it was.
"""

import keras
import tensorflow as tf

from looper import errors
from looper import objectives
from looper.data import checks
from looper.data import splits


def check_inputs(trainer, split: str, probe: int = 256) -> None:
  """Runs `trainer`'s model and loss eagerly on the first `probe` examples.

  Args:
    trainer: a built `looper.trainer.Trainer`.
    split: a split its config names (train or eval).
    probe: how many examples to run.

  Raises:
    ConfigError: one line naming what does not fit and the fix.
  """
  config = trainer.config
  field = splits.split_field(config, split)
  if split == config.data.train_split:
    trainer.source(split).check(trainer.strategy.num_replicas_in_sync,
                                config.train.batch_size, "train.batch_size")
  examples = checks.check_nonempty(trainer.examples(split), split, field)
  # padded_batch: examples of variable length (data.bucket) fit too.
  inputs, labels = next(iter(examples.padded_batch(probe)))
  shapes = tf.nest.map_structure(lambda t: (t.shape[1:].as_list(),
                                            t.dtype.name), inputs)
  # Only what a mismatch raises becomes one line; any other error is a bug
  # in the user's code and keeps its traceback.
  mismatch = (ValueError, TypeError, tf.errors.InvalidArgumentError)
  try:
    logits = tf.cast(trainer.model(inputs, training=False), tf.float32)
  except mismatch as e:
    raise errors.ConfigError(
        f"config.model_fn: the model rejects the examples of split"
        f" {split!r} (inputs {shapes}): {errors.first_line(e)}; make the"
        " model's Input match what config.dataset_fn yields") from None
  if config.loss == "sparse_categorical_crossentropy":
    checks.check_class_labels(labels, logits, split)
  _check_no_final_squash(trainer.model, config.loss)
  loss = objectives.display_name(config.loss)
  try:
    per_example = trainer.compute_loss(labels, logits)
  except mismatch as e:
    raise errors.ConfigError(
        f"config.loss={loss} fails on logits of shape"
        f" {logits.shape.as_list()} and labels of shape"
        f" {labels.shape.as_list()} ({labels.dtype.name}):"
        f" {errors.first_line(e)}; make the labels of split {split!r} fit"
        " the loss, or choose another config.loss") from None
  if per_example.shape.as_list() != [len(logits)]:
    raise errors.ConfigError(
        f"config.loss={loss} returns shape {per_example.shape.as_list()} for"
        f" a batch of {len(logits)}; return one loss per example (shape"
        " [batch]): looper averages over the global batch itself")


def _check_no_final_squash(model, loss) -> None:
  """A model whose last layer applies softmax or sigmoid, trained with a loss
  on logits, trains silently with the wrong loss (Keras warns of it too)."""
  if loss not in objectives.FROM_LOGITS or not getattr(model, "layers", None):
    return
  last = model.layers[-1]
  squash = getattr(getattr(last, "activation", None), "__name__", "")
  if isinstance(last, keras.layers.Softmax):
    squash = "softmax"
  if squash in ("softmax", "sigmoid"):
    raise errors.ConfigError(
        f"config.model_fn: the model's last layer {last.name!r} applies"
        f" {squash}, but config.loss={loss!r} takes logits (from_logits): it"
        " would train on squashed outputs; drop the final activation"
        " (looper's losses and metrics take logits; override Trainer.serve"
        " to serve probabilities)")
