"""The run's model and optimizer as Keras callbacks see them (`self.model`).

Synopsis (what looper.control.callbacks hands each callback)::

    view = ModelView(model, OptimizerView(optimizer, rate_scale))
    callback.set_model(view)
    view.optimizer.learning_rate = 1e-4   # ReduceLROnPlateau: the scale set
    view.stop_training = True             # EarlyStopping: read by the run

Each view forwards every other attribute to what it wraps, and keeps what
fit() would set on a Keras model (`stop_training`, a settable rate) off the
model itself, so neither reaches its checkpoint or export.
"""

import math

import keras

from looper import errors


class OptimizerView:
  """The run's optimizer as callbacks see it (`model.optimizer`): all of
  it, its `learning_rate` settable although looper's rate is a schedule.

  Setting the rate sets the learning-rate scale (the Trainer's
  `learning_rate_scale`), the factor on
  the schedule (looper.options.optimizers.Scaled): with the default
  constant schedule the rate is the one set, as under fit; under a
  decaying one, the decay goes on from it. A Trainer whose optimizer has a
  rate of its own (a float: Keras' variable) gets it set directly.
  """

  def __init__(self, optimizer, scale):
    self.__dict__.update(_optimizer=optimizer, _scale=scale)

  def __getattr__(self, name):  # what is not here (not during a copy)
    return getattr(_wrapped(self, "_optimizer", name), name)

  @property
  def learning_rate(self) -> float:
    return float(keras.ops.convert_to_numpy(self._optimizer.learning_rate))

  @learning_rate.setter
  def learning_rate(self, value: float) -> None:
    try:
      self._optimizer.learning_rate = value  # a float rate: Keras' own
      return
    except TypeError:  # a schedule (looper's): "not settable"
      pass
    current = self.learning_rate
    if current == value or not current:  # 0 (a schedule's end) stays 0
      return
    scale = float(self._scale.numpy())
    self._scale.assign(scale * value / current)
    if not math.isclose(self.learning_rate, value, rel_tol=1e-5):
      self._scale.assign(scale)
      raise errors.ConfigError(
          f"the learning rate was set to {value}, but the Trainer's optimizer"
          " (build_optimizer) has a schedule that does not read"
          " trainer.learning_rate_scale; build it with looper.options."
          "optimizers.build(..., scale=self.learning_rate_scale)")


class ModelView:
  """The run's model as callbacks see it: every attribute the model's,
  but `optimizer` (an OptimizerView) and `stop_training`, kept here so
  neither is tracked by the model (its checkpoint and export)."""

  def __init__(self, model, optimizer: OptimizerView):
    self.__dict__.update(_model=model, optimizer=optimizer,
                         stop_training=False)

  def __getattr__(self, name):
    return getattr(_wrapped(self, "_model", name), name)

  def __setattr__(self, name, value):
    if name in self.__dict__:
      self.__dict__[name] = value
    else:  # what a callback changes on the model (trainable, ...)
      setattr(self._model, name, value)


def _wrapped(view, field: str, name: str):
  """What a view wraps; an AttributeError for `name` while it has none (a
  copy made without __init__ asks for __deepcopy__ first)."""
  if field not in view.__dict__:
    raise AttributeError(name)
  return view.__dict__[field]
