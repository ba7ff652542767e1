"""The train loop: K replica steps in one tf.function call, built from a step.

Synopsis::

    loop = TrainLoop(step_fn, strategy=strategy,
                     iterator=input.train_iterator, stop=stop_flag,
                     steps_per_loop=100, step=step_variable,
                     weights=model.trainable_variables,
                     on_start=metrics.reset,
                     on_end=lambda ran, values: {...})
    values, logs, finite = loop(steps)  # one call; fewer steps on a stop
    values["loss"]                      # each step's, summed over replicas

`step_fn(batch)` is one replica's update: it gets this replica's part of
`batches_per_step` micro-batches (concatenated) and returns its share of
the global mean loss, or a dict of per-step scalars (the loss beside a
GAN's two losses, an auxiliary loss, tokens seen: `by_name`), each this
replica's share: summed over the replicas, a step's value is the global
batch's. Their names are fixed when the step is traced. As Keras'
`make_train_function(step_function)` and Orbit's
`create_tf_while_loop_fn(step_fn)`, the loop is built from the step and
keeps no reference to whoever owns it (the Trainer builds one from its
`train_step`: looper.train.trainer).

One call, all on the device side (no host sync per step)::

    on_start()                             # e.g. reset the train metrics
    for i in range(steps):                 # a tf.while_loop over an int32
      if stop requested: break             # tensor (not retraced per K)
      batches = next(iterator) x batches_per_step
      strategy.run(step_fn, batches)       # each replica writes its share
                                           # of every value to row i
    step += steps run
    values = the buffer's rows, summed over the replicas once
    logs = on_end(steps run, values)       # e.g. the data position, metrics
    finite = no NaN/inf in any replica's `weights`
    return the values (each step's, as the step returns them), the logs,
      the seconds spent waiting for batches and, for sequences, the tokens
      the steps read (summed likewise)

The logs also hold the loop's FLOPs: its steps times the FLOPs of one,
counted once from the first call's traced graph (looper.measure.flops).

The loop body is `next(iterator)` and the replica step, as in the TPU
guide's loop: nothing in it reads model or optimizer state or reduces
across replicas (tests/e2e/replicas/test_loop_graph.py checks the graph).
Per-loop work (`on_start`, `on_end`, the finiteness check) runs once,
outside it.
"""

import contextlib
import time
from typing import Any, Callable, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from looper import autograph
from looper import errors
from looper.options import precision
from looper.measure import flops
from looper.train import stopping


# The name scope of the replica function's ops (the graph test finds the
# loop's own ops as the ones outside it).
REPLICA_STEP = "replica_step"
_UNCOUNTED = object()  # TrainLoop's FLOPs and tokens before they are known


class TrainLoop:
  """Runs `step_fn` K times per call (see module doc).

  Args:
    step_fn: one replica's update, `step_fn(batch) -> loss` or a dict of
      per-step scalars (see module doc).
    strategy: the run's tf.distribute strategy.
    iterator: returns the train batches' distributed iterator (called once
      per call, so the data may reopen it between calls: a roll-back).
    stop: the run's `looper.train.stopping.StopFlag`, read before each step.
    steps_per_loop: the longest call the run makes (the Controller's
      train.steps_per_loop): the rows of the per-step buffer. A longer call grows it
      once, with a log line: the function is traced again (seconds), which
      would be silent otherwise, and refusing would make a notebook's
      `trainer.train(1000)` think in buffer sizes; the Controller never
      asks for more.
    step: the update counter (an int64 variable), advanced by the steps run.
    weights: the variables checked for NaN/inf after each call (Keras
      variables: a model's).
    batches_per_step: micro-batches per update (train.grad_accum_steps).
    on_start: per-call work before the first step, in the function.
    on_end: per-call work after the steps, given how many ran (a tensor)
      and their values (as the step returns them, each [ran], summed over
      the replicas), in the function; returns logs (tensors by name).
    sequences: whether the inputs are token sequences (their tokens are
      counted then); called at the first trace, as it may open the data.
    timed: time the input wait (TensorFlow's op determinism refuses the
      timestamps: False under train.deterministic).
  """

  def __init__(self, step_fn: Callable, *, strategy: tf.distribute.Strategy,
               iterator: Callable, stop: stopping.StopFlag,
               steps_per_loop: int, step: tf.Variable, weights: Sequence,
               batches_per_step: int = 1,
               on_start: Callable[[], None] = lambda: None,
               on_end: Callable[[tf.Tensor, Any], dict] = (
                   lambda ran, values: {}),
               sequences: Callable[[], bool] = lambda: False,
               timed: bool = True):
    self._step_fn, self._strategy = step_fn, strategy
    self._iterator, self._stop = iterator, stop
    self._step, self._weights = step, weights
    self._batches = batches_per_step
    self._on_start, self._on_end = on_start, on_end
    self._sequences, self._timed = sequences, timed
    # The step's value names (None: it returns the loss alone), known once
    # traced; the buffer's width follows them (`_fit_width`).
    self._names = _UNCOUNTED
    self._make_buffer(steps_per_loop)
    self._token_count = _UNCOUNTED  # see _tokens
    self._flops = _UNCOUNTED  # of one step, once traced (None: unknown)

  @property
  def _tokens(self) -> tf.Variable | None:
    """Sequences: each replica adds up the tokens of its steps here
    (flops.tokens), read once per call; None for other inputs. Made by the
    first call (before its trace), not with the loop: `sequences` reads
    the data's spec, so a bad split raises where the input is opened."""
    if self._token_count is _UNCOUNTED:
      self._token_count = None
      # Out of a trace, if in one: the spec may open a dataset of the data.
      with tf.init_scope():
        sequence = self._sequences()
      if sequence:
        with tf.init_scope(), self._strategy.scope():
          self._token_count = tf.Variable(
              0.0, trainable=False, name="tokens",
              synchronization=tf.VariableSynchronization.ON_READ,
              aggregation=tf.VariableAggregation.SUM)
    return self._token_count

  def _make_buffer(self, steps: int) -> None:
    """Room for the per-step values of a `steps`-step call (and the train
    function that writes them, traced anew).

    Each replica writes its share of step i's values at row i, one column
    a value (in the order the step returns them); reading the buffer after
    the loop sums the replicas once per call, not per step (a per-step
    reduction is a device-to-host wait per step on a GPU or TPU). The
    columns are known once the step is traced, and a variable made in a
    trace makes tf.function trace twice: so the width is left open, and
    the trace sets it (`_fit_width`).
    """
    self._width = 1 if self._names in (None, _UNCOUNTED) else len(
        self._names)
    with self._strategy.scope():
      self._values = tf.Variable(
          tf.zeros([steps, self._width]), shape=tf.TensorShape([steps, None]),
          trainable=False, name="step_values",
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)
    self.function = tf.function(self._train_loop)

  def _fit_width(self) -> None:
    """The buffer as wide as the step's values, set while its trace runs,
    before the traced function does (eagerly: the buffer is scratch, only
    the rows a call writes are read)."""
    width = 1 if self._names is None else len(self._names)
    if width != self._width:
      self._width = width
      with tf.init_scope():
        for part in self._strategy.experimental_local_results(self._values):
          part.assign(tf.zeros([part.shape[0], width]))

  def __call__(self, steps: int) -> tuple[Any, dict, bool]:
    """(each step's values as the step returns them, `on_end`'s logs +
    input_wait_fraction, tokens and flops of the steps run, whether the
    weights are finite) of up to `steps` steps."""
    room = self._values.shape[0]
    if steps > room:
      logging.info("A train call of %d steps grows the loss buffer from %d"
                   " (train.steps_per_loop); the train function is traced"
                   " again", steps, room)
      self._make_buffer(steps)
    if self._stop.before_loop():  # some worker got a signal: all stop here
      return self._named(np.zeros([0, self._width], np.float32)), {}, True
    # Before the trace: a variable made in a tf.function's first trace
    # makes it trace twice (the LM's loop: 8 s more on 2 replicas here).
    self._tokens  # pylint: disable=pointless-statement
    args = (self._iterator(),
            None if steps == 1 else tf.constant(steps, tf.int32))
    start = time.perf_counter()
    # A one-step call (the profiler window's) is marked as a step for the
    # Profile tab; a K-step call's while loop hides steps from it anyway,
    # so it skips the marker and the read of `step` it needs.
    with (tf.profiler.experimental.Trace(
        "train", step_num=int(self._step.numpy()) + 1, _r=1) if steps == 1
          else contextlib.nullcontext()):
      rows, finite, waited, results = self.function(*args)
      rows = rows.numpy()  # waits for the call to finish
    logs = {k: float(v) for k, v in results.items()}
    if self._timed:
      logs["input_wait_fraction"] = float(waited) / max(
          time.perf_counter() - start, 1e-9)
    if self._flops is _UNCOUNTED:  # the call just traced it, if anyone did
      self._flops = flops.per_step(self.function.get_concrete_function(*args),
                                   self._strategy)
      if self._strategy.extended.should_checkpoint:  # the chief says it
        logging.info("%s", flops.describe(self._flops))
    if self._flops is not None:
      logs["flops"] = len(rows) * self._flops
    return self._named(rows), logs, bool(finite)

  def _named(self, rows):
    """Rows of the buffer (an array or a tensor) as the step returns its
    values: a column, or a dict of them by name (before the first trace:
    a column)."""
    if self._names in (None, _UNCOUNTED):
      return rows[:, 0]
    return {name: rows[:, j] for j, name in enumerate(self._names)}

  @autograph.plain
  def _train_loop(self, iterator, steps):
    """`steps` (an int32 tensor) steps in a tf.while_loop; steps=None: one
    step and no loop, which the profiler can see as a step (a while loop
    hides it: BUILD.md "TensorBoard"), for one-step calls.

    One process reads the stop flag each step: a host variable only the
    host writes, so reading it waits for nothing on a device.
    """
    stop = self._stop
    self._on_start()
    if self._tokens is not None:
      self._tokens.assign(0.0)
    waited = tf.constant(0.0, tf.float64)  # seconds spent in get_next
    if steps is None:
      waited, ran = self._loop_step(iterator, 0, waited), 1
    else:
      def more(i, _):  # the stop flag is read before each step
        if not stop.cuts_loops:
          return i < steps
        return tf.logical_and(i < steps,
                              tf.logical_not(stop.flag.read_value()))
      ran, waited = tf.while_loop(
          more, lambda i, w: (i + 1, self._loop_step(iterator, i, w)),
          (tf.constant(0), waited))
    self._step.assign_add(tf.cast(ran, tf.int64))
    self._fit_width()  # the step is traced: its values are known
    rows = self._values.read_value()[:ran]
    results = dict(self._on_end(ran, self._named(rows)))
    # A finite loss does not prove finite weights (the last step's gradient
    # may not be): checked here so no NaN state is ever saved.
    finite = precision.finite_everywhere(self._strategy, self._weights)
    if self._tokens is not None:
      results["tokens"] = self._tokens.read_value()
    return rows, finite, waited, results

  @autograph.plain
  def _loop_step(self, iterator, i, waited):
    """Step i of a train call: next batches, the replica step.

    The input wait is timed around get_next on the host. It adds no
    dependency between steps: a loop iteration starts once the previous
    one's ops have run (TensorFlow's own ordering of stateful ops), which on
    a CPU means its update is done and on a GPU or TPU that its kernels are
    queued; so the figure is the host's wait for the input pipeline, the
    share an input-bound run loses. Not under train.deterministic:
    TensorFlow's op determinism refuses tf.timestamp.
    """
    before = [tf.timestamp()] if self._timed else []
    with tf.control_dependencies(before):
      batches = [next(iterator) for _ in range(self._batches)]
    if self._timed:
      with tf.control_dependencies(tf.nest.flatten(batches,
                                                   expand_composites=True)):
        waited += tf.timestamp() - before[0]
    self._strategy.run(self._train_step, args=(i, *batches))
    return waited


  @autograph.plain
  def _train_step(self, i, *batches):
    """The replica function: the micro-batches of one update as one batch;
    this replica's share of each value goes to its row i of the buffer
    (its tokens, for sequences, to the tokens variable)."""
    with tf.name_scope(REPLICA_STEP):
      batch = (batches[0] if len(batches) == 1 else
               tf.nest.map_structure(lambda *t: tf.concat(t, 0), *batches))
      row = self._row(self._step_fn(batch))
      if self._tokens is not None:
        self._tokens.assign_add(flops.tokens(batch))
      # The whole buffer is written back: a slot of a TPU variable is a
      # tensor (TPU variables read their value as the operand), which has
      # no assign.
      self._values.assign(tf.tensor_scatter_nd_update(
          self._values, [[i]], [row]))

  def _row(self, values) -> tf.Tensor:
    """The step's return as one row of float32s; its names (None: a
    scalar, the loss) kept from the first trace, the same in every one."""
    names = tuple(values) if isinstance(values, dict) else None
    if self._names is _UNCOUNTED:
      self._names = names
    elif names != self._names:
      raise ValueError(
          f"The train step returned {names or 'a scalar'} where an earlier"
          f" trace returned {self._names or 'a scalar'}: a step's per-step"
          " values keep their names")
    values = values.values() if names else [values]
    return tf.stack([tf.cast(v, tf.float32) for v in values])


def by_name(train_step: Callable, trainer: str) -> Callable:
  """A step function returning `train_step`'s values by name, 'loss'
  first: a scalar is the loss; a dict must hold 'loss' (the NaN and spike
  roll-back reads it) and scalars only, or the trace ends in one line
  naming `trainer` (config.trainer's class)."""
  def step(batch) -> dict[str, tf.Tensor]:
    values = train_step(batch)
    if not isinstance(values, dict):
      values = {"loss": values}
    if "loss" not in values:
      raise errors.ConfigError(
          f"config.trainer={trainer}: train_step returned {sorted(values)}"
          " without 'loss'; return its share of the global mean loss under"
          " 'loss' beside them")
    for name, value in values.items():
      rank = tf.convert_to_tensor(value).shape.rank
      if not isinstance(name, str) or rank != 0:
        raise errors.ConfigError(
            f"config.trainer={trainer}: train_step returned {name!r} of"
            f" rank {rank}; each per-step value is a scalar under a name"
            " (this replica's share: summed over the replicas)")
    return {"loss": values["loss"],
            **{k: v for k, v in values.items() if k != "loss"}}
  return step
