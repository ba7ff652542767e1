"""Every private Keras API looper uses on layers and metrics, one function each.

Synopsis::

    keras_compat.sublayers(model)                # randomness: nested layers
    keras_compat.seed_generators(layer)          # randomness: their states
    keras_compat.output_operation(model)         # dry_run: the last op
    keras_compat.metric_direction(metric)        # callbacks: mode 'auto'
    with keras_compat.keras_variables_deferred(): ...  # parsing: metric objects

As looper.compat (TensorFlow's private APIs and Keras' optimizer and
checkpoint ones): each reaches into a name Keras may move in any release;
its docstring says what it touches, why, and the versions it was checked
on (compat.CHECKED_ON); tests/unit/floor/test_compat.py fails when one
moves. Private modules are imported inside the function that needs them.
Nothing here imports from looper.
"""

import contextlib


def sublayers(model) -> list:
  """`model` and every layer inside it (a MultiHeadAttention's dropout, an
  RNN's cell), each once, in the order Keras tracks them.

  Touches: Keras' `Layer._flatten_layers(include_self, recursive)`. Why:
  `model.layers` is the top level; random layers sit anywhere (randomness).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return list(model._flatten_layers(include_self=True, recursive=True))  # pylint: disable=protected-access


def seed_generators(layer) -> list:
  """The SeedGenerators `layer` itself holds (not its sublayers').

  Touches: Keras' `Layer._seed_generators` (its tracker's SeedGenerators).
  Why: their states are variables `tf.train.Checkpoint(model=)` does not
  reach; looper checkpoints them (looper.train.randomness).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return list(getattr(layer, "_seed_generators", []))


@contextlib.contextmanager
def keras_variables_deferred():
  """Keras variables made inside (a metric object's) create no TensorFlow
  variable, now or later.

  Touches: `keras.StatelessScope(initialize_variables=False)` (a Keras
  variable is registered, not created) and Keras' global list of those
  (`global_state` "uninitialized_variables"), dropped: the next scope to
  close would create them.
  Why: a config file's metric object would start TensorFlow while the
  config loads (before the devices are set up); looper rebuilds it later.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
  key = "uninitialized_variables"
  before = list(global_state.get_global_attribute(key, []) or [])
  try:
    with keras.StatelessScope(initialize_variables=False):
      yield
  finally:
    global_state.set_global_attribute(key, before)


def output_operation(model):
  """The Keras operation (a layer, or an op such as `keras.ops.softmax`)
  that makes a functional or Sequential model's one output; None for a
  subclassed model or several outputs.

  Touches: `KerasTensor._keras_history` ((operation, node, tensor index)
  of each symbolic tensor). Why: `model.layers` leaves out ops: a model
  ending in `keras.ops.softmax(x)` would look linear to the dry run.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  outputs = getattr(model, "outputs", None)
  if not outputs or len(outputs) != 1:
    return None
  history = getattr(outputs[0], "_keras_history", None)
  return history.operation if history is not None else None


def metric_direction(metric) -> str | None:
  """'up' or 'down': which way a Keras metric gets better; None if unsaid.

  Touches: the `_direction` Keras' metrics set in their constructors,
  which a MonitorCallback's mode 'auto' reads through a compiled model.
  Why: EarlyStopping(monitor="val_accuracy") on looper's model, which is
  not compiled (looper.control.callback_state.resolve_modes).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return getattr(metric, "_direction", None)
