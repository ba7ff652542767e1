"""AutoGraph for the user's code only: looper's traced code is plain TensorFlow.

Synopsis::

    @conversion.plain                  # looper's: traced as written
    def train_step(self, batch): ...

    conversion.convert_overrides(MyTrainer, Trainer)  # Trainer does this
    loss_fn = conversion.user(config.loss)            # a user's function

AutoGraph rewrites the source of every function a `tf.function` calls
(20-200 ms each, most of the first trace: BUILD.md "first loop"). Keras 3's
`fit` skips it for its own step functions, and so does looper: the train
and eval loops are explicit `tf.while_loop`s and no looper function in
them is converted. A user's code keeps what any `tf.function` gives it:
a Trainer subclass's override of a traced method, and a loss function
assigned in the config, are converted on their first call inside a graph,
so they may branch on tensors (`if tf.reduce_sum(x) > 0:`). Keras objects
(models, layers, metrics) are never converted, in fit or here.
"""

import functools
import inspect

from absl import logging
import tensorflow as tf

_PLAIN = "_looper_plain"  # marks a method as traced looper code
_USER = "_looper_user"  # marks a function `user` wraps
# Never converted: AutoGraph's own rules skip keras and tensorflow.
_LIBRARIES = ("keras", "tensorflow", "looper")


def plain(fn):
  """`fn`, never rewritten by AutoGraph (and marked as traced code)."""
  wrapped = tf.autograph.experimental.do_not_convert(fn)
  setattr(wrapped, _PLAIN, True)
  return wrapped


def user(fn):
  """`fn` (a function, or a functools.partial of one) converted by
  AutoGraph on its first call inside a graph; called as written outside
  one (eagerly), or if its source cannot be read (as AutoGraph does: a
  warning, then the function as written)."""
  if isinstance(fn, functools.partial):
    return functools.partial(user(fn.func), *fn.args, **fn.keywords)
  # A Keras object or a library's function: left as AutoGraph leaves it.
  if (not inspect.isfunction(fn) or getattr(fn, _PLAIN, False) or
      getattr(fn, _USER, False) or
      (fn.__module__ or "").split(".")[0] in _LIBRARIES):
    return fn
  converted = []

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if not tf.inside_function():
      return fn(*args, **kwargs)
    if not converted:
      try:
        converted.append(tf.autograph.to_graph(fn))
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("AutoGraph could not convert %s (%s); it runs as"
                        " written: branch on tensors with tf.cond there",
                        fn.__qualname__, e)
        converted.append(fn)
    return converted[0](*args, **kwargs)
  setattr(wrapper, _USER, True)
  return wrapper


def convert_overrides(cls, base) -> None:
  """Converts (`user`) each method `cls` uses in place of one `base` marks
  `plain`, whether `cls` defines it or inherits it (a mixin): the user's
  code in the traced loops."""
  for name, traced in vars(base).items():
    if getattr(traced, _PLAIN, False):
      fn = inspect.getattr_static(cls, name)
      if fn is not traced and inspect.isfunction(fn):
        setattr(cls, name, user(fn))
