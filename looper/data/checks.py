"""The checks every input mode shares: what an example and a split must be.

Synopsis::

    examples = checks.checked(dataset_fn(config, split), split)  # or raises
    checks.check_nonempty(examples, split, "data.train_split")
    n = checks.num_examples(examples, split)      # counted if TF cannot tell
    checks.python_calls(checks.ops_in(examples))  # ['tf.py_function']

Each raises a ConfigError whose one line names the config field, the value
and the fix, before any training step runs. What a batch must be (its
sizes over the replicas) is `looper.data.batch`'s.
"""

import tensorflow as tf

from looper import compat
from looper import autograph
from looper.data import batch as batch_lib
from looper.errors import ConfigError

_INFINITE = tf.data.INFINITE_CARDINALITY
_UNKNOWN = tf.data.UNKNOWN_CARDINALITY
# Counts a dataset whose cardinality tf.data cannot tell (Dataset.reduce);
# plain: AutoGraph would rewrite even this lambda on every count.
count = autograph.plain(lambda c, _: c + 1)
# Ops that call back into this process' Python: neither a TPU host nor a
# tf.data service worker can run them (op -> what the pipeline called).
PYTHON_OPS = {"PyFunc": "tf.numpy_function", "PyFuncStateless":
              "tf.numpy_function", "EagerPyFunc": "tf.py_function",
              "GeneratorDataset": "tf.data.Dataset.from_generator"}


def checked(dataset: tf.data.Dataset, split: str,
            variable: bool = False) -> tf.data.Dataset:
  """Returns `dataset` if it yields (inputs, label) or (inputs, label,
  sample_weight) examples of static shape, the weight a float.

  `variable` (config.data.bucket is set): the inputs may have dimensions of
  unknown size (padded per batch) but must be plain tensors of known rank;
  the label and weight must still be static.
  """
  if not isinstance(dataset, tf.data.Dataset):
    raise ConfigError(
        f"config.dataset_fn returned {type(dataset).__name__} for split"
        f" {split!r}; return a tf.data.Dataset of (inputs, label) examples")
  spec = dataset.element_spec
  if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
    raise ConfigError(
        f"config.dataset_fn yields {spec} for split {split!r}; yield"
        " (inputs, label) pairs or (inputs, label, sample_weight) triples,"
        " e.g. Dataset.from_tensor_slices((x, y))")
  inputs, label, weight = batch_lib.parts(spec)
  for part in [] if weight is None else tf.nest.flatten(weight):
    if not part.dtype.is_floating:
      raise ConfigError(
          f"config.dataset_fn yields sample weights of dtype"
          f" {part.dtype.name} for split {split!r}; make the third element"
          " of each example a float (tf.cast(weight, tf.float32))")
  for part in tf.nest.flatten(spec[1:] if variable else spec):
    if not part.shape.is_fully_defined():
      raise ConfigError(
          f"config.dataset_fn yields a component of shape {part.shape} for"
          f" split {split!r}; yield single unbatched examples of static"
          " shape (looper batches them by train.batch_size/eval.batch_size),"
          " or set --config.data.bucket to pad variable-length inputs")
  for part in tf.nest.flatten(inputs) if variable else []:
    # padded_batch pads plain tensors only; a row sliced from a RaggedTensor
    # is one until a map turns it into a tensor.
    if not isinstance(part, tf.TensorSpec):
      raise ConfigError(
          f"config.dataset_fn yields inputs of type {type(part).__name__} for"
          f" split {split!r}; yield plain tensors of variable length, e.g."
          " add .map(lambda x, y: (x, y)) after from_tensor_slices(ragged)")
    if part.shape.rank is None:
      raise ConfigError(
          f"config.dataset_fn yields inputs of unknown rank for split"
          f" {split!r}; give every input a known rank (tf.ensure_shape)")
  return dataset


def ops_in(dataset: tf.data.Dataset) -> set[str]:
  """The op types anywhere in `dataset`'s pipeline, its functions' too."""
  graph = compat.dataset_graph(dataset)
  return {n.op for n in graph.node} | {
      n.op for f in graph.library.function for n in f.node_def}


def python_calls(ops: set[str]) -> list[str]:
  """What the pipeline of `ops` (`ops_in`) calls Python through, sorted."""
  found = {PYTHON_OPS[op] for op in ops if op in PYTHON_OPS}
  if PYTHON_OPS["GeneratorDataset"] in found:  # numpy_function inside
    found.discard(PYTHON_OPS["PyFunc"])
  return sorted(found)


def num_examples(dataset: tf.data.Dataset, split: str,
                 field: str = "data.eval_split") -> int:
  """Size of a finite, non-empty dataset; counted by one pass if TF cannot tell.

  Raises:
    ConfigError: the dataset is endless or empty (`field` names the split).
  """
  n = int(dataset.cardinality())
  if n == _INFINITE:
    raise ConfigError(
        f"config.dataset_fn returned an endless dataset for split {split!r};"
        " return one pass over the data (looper repeats the train split)")
  if n == _UNKNOWN:
    n = int(dataset.reduce(tf.constant(0, tf.int64), count))
  if not n:
    raise empty_split(split, field)
  return n


def check_nonempty(dataset: tf.data.Dataset, split: str | None,
                   field: str = "data.train_split") -> tf.data.Dataset:
  """Returns `dataset` if it has an example; reads at most one to find out.

  An empty train split would make the endless epoch stream of
  `train_dataset` spin forever without yielding a batch, so it must be
  caught before training starts.

  Args:
    dataset: one pass over a split, e.g. from `checked`.
    split: the split's name as configured (None: not known here).
    field: the config field that names the split, for the error.

  Raises:
    ConfigError: the dataset has no examples.
  """
  n = int(dataset.cardinality())
  # Unknown (e.g. after a filter): take one example rather than count, so a
  # non-empty split costs one element, not a pass. Only eagerly, as a graph
  # cannot run the probe; distribute_datasets_from_function calls its
  # dataset function eagerly, so `train_dataset` is covered.
  if n == _UNKNOWN and tf.executing_eagerly():
    n = sum(1 for _ in dataset.take(1))
  if not n:
    raise empty_split(split, field)
  return dataset


def empty_split(split: str | None, field: str) -> ConfigError:
  value = "" if split is None else f"={split!r}"
  return ConfigError(
      f"config.{field}{value} selects no examples: config.dataset_fn returned"
      f" an empty dataset; widen --config.{field} or check the data"
      " dataset_fn reads")


def check_class_labels(labels: tf.Tensor, logits: tf.Tensor,
                       split: str, ignored: int | None = None) -> None:
  """Class-id labels for logits [batch, ..., classes]: integer, one per
  position of the logits but the last (one per example for [batch,
  classes], one per token for [batch, T, classes]), in range.

  Raises:
    ConfigError: float labels (silently truncated by the loss), one-hot or
      other labels of the wrong shape, or ids outside [0, classes) other
      than `ignored` (a Keras loss object's ignore_class).
  """
  where = f"config.dataset_fn yields labels for split {split!r}"
  if not labels.dtype.is_integer:
    raise ConfigError(
        f"{where} of dtype {labels.dtype.name}; class ids must be integers:"
        " tf.cast(label, tf.int32) in dataset_fn (or use another config.loss)")
  if logits.shape.rank < 2:
    raise ConfigError(
        f"config.model_fn returns outputs of shape"
        f" {logits.shape[1:].as_list()} per example; return logits of shape"
        " [classes] for config.loss='sparse_categorical_crossentropy'")
  if labels.shape[1:] != logits.shape[1:-1]:
    want = logits.shape[1:-1].as_list()
    raise ConfigError(
        f"{where} of shape {labels.shape[1:].as_list()} each; give one class"
        " id per example (shape []): not one-hot, not [1]" if not want else
        f"{where} of shape {labels.shape[1:].as_list()} each, for logits of"
        f" shape {logits.shape[1:].as_list()}; give one class id per"
        f" position (shape {want}): not one-hot")
  classes = logits.shape[-1]
  if ignored is not None:
    labels = tf.boolean_mask(labels, tf.not_equal(labels, ignored))
    if not tf.size(labels):
      return
  low, high = int(tf.reduce_min(labels)), int(tf.reduce_max(labels))
  if low < 0 or high >= classes:
    raise ConfigError(
        f"{where} up to {high} (from {low}), but the model has {classes}"
        f" outputs; class ids must lie in [0, {classes}): widen the model's"
        " last layer or fix the labels")
