"""AutoGraph for the user's code only: looper's traced code is plain TensorFlow.

Synopsis::

    @autograph.plain                  # looper's: traced as written
    def train_step(self, batch): ...

    autograph.convert_overrides(MyTrainer, Trainer)  # Trainer does this
    loss_fn = autograph.user(config.loss, "config.loss")  # a user's fn

AutoGraph rewrites the source of every function a `tf.function` calls
(20-200 ms each, most of the first trace: BUILD.md, "AutoGraph"). Keras 3's
`fit` skips it for its own step functions, and so does looper: the train
and eval loops are explicit `tf.while_loop`s and no looper function in
them is converted. A user's code keeps what any `tf.function` gives it:
a Trainer subclass's override of a traced method (defined or inherited
when the class is made), and a loss in the config (a function, a bound
method, a callable object or a functools.partial of one), are converted on
their first call inside a graph, so they may branch on tensors
(`if tf.reduce_sum(x) > 0:`), as may every function they call. Keras
objects (models, layers, metrics) are never converted, in fit or here.
The one looper function still converted is file mode's per-file stream
(`looper.data.shards`), which calls the user's parse.
"""

import functools
import inspect
import types

from absl import logging
import tensorflow as tf

_PLAIN = "_looper_plain"  # marks a method as traced looper code
_USER = "_looper_user"  # marks the wrapper `user` returns
# Whose functions `user` leaves as they are (to_graph itself would convert
# any): Keras' and TensorFlow's, as AutoGraph's own rules skip them, and
# looper's, which are plain.
_LIBRARIES = ("keras", "tensorflow", "looper")


def plain(fn):
  """`fn`, never rewritten by AutoGraph (and marked as traced code)."""
  wrapped = tf.autograph.experimental.do_not_convert(fn)
  setattr(wrapped, _PLAIN, True)
  return wrapped


def user(fn, where: str):
  """`fn` (a function, a bound method, a callable object, or a
  functools.partial of one) converted by AutoGraph on its first call inside
  a graph; called as written outside one (eagerly), or if its source cannot
  be read (as AutoGraph does: a warning naming `where`, then `fn` as
  written)."""
  if isinstance(fn, functools.partial):
    return functools.partial(user(fn.func, where), *fn.args, **fn.keywords)
  if inspect.isfunction(fn) or inspect.ismethod(fn):
    target, module = fn, fn.__module__
  elif callable(fn) and not inspect.isclass(fn):
    target, module = fn.__call__, type(fn).__module__
  else:
    return fn
  # A Keras object, a library's function, a builtin (no Python source),
  # or one already marked: left as AutoGraph (and fit) leaves it.
  if (not (inspect.isfunction(target) or inspect.ismethod(target)) or
      getattr(fn, _PLAIN, False) or getattr(fn, _USER, False) or
      (module or "").split(".")[0] in _LIBRARIES):
    return fn
  converted = []

  def convert():
    try:
      if inspect.ismethod(target):  # to_graph drops the binding: bind again
        return types.MethodType(tf.autograph.to_graph(target.__func__),
                                target.__self__)
      return tf.autograph.to_graph(target)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("AutoGraph could not convert %s (%s) from %s; it runs"
                      " as written: branch on tensors with tf.cond there",
                      target.__qualname__, e, where)
      return target

  # do_not_convert: a tf.function around it (tpu_check's, jit_compile's)
  # does not convert this wrapper; the converted function turns AutoGraph
  # back on inside itself.
  @tf.autograph.experimental.do_not_convert
  @functools.wraps(target)
  def wrapper(*args, **kwargs):
    if not tf.inside_function():
      return target(*args, **kwargs)
    if not converted:
      converted.append(convert())
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
        wrapped = user(fn, f"{cls.__qualname__}.{name}")
        if wrapped is not fn:  # not one a parent class converted already
          setattr(cls, name, wrapped)
