"""The train loop: K of a Trainer's replica steps in one tf.function call.

Synopsis::

    loop = TrainLoop(trainer)           # the Trainer makes its own
    losses, logs, finite = loop(steps)  # one call; fewer losses on a stop

One call, all on the device side (no host sync per step)::

    reset train metrics
    for i in range(steps):                 # a tf.while_loop over an int32
      if stop requested: break             # tensor (not retraced per K)
      batches = next(iterator) x grad_accum_steps
      strategy.run(replica step, i, batches)  # each replica writes its
                                              # share of the loss to slot i
    step += steps run; the input's position advances
    finite = no NaN/inf in any replica's weights
    return the loss buffer (summed over replicas once: each step's global
      mean loss), metric results, the seconds spent waiting for batches
      and, for sequences, the tokens the steps read (summed likewise)

The logs also hold the loop's FLOPs: its steps times the FLOPs of one,
counted once from the first call's traced graph (looper.train.flops).

The loop body is `next(iterator)` and the replica step, as in the TPU
guide's loop: nothing in it reads model or optimizer state or reduces
across replicas (tests/e2e/replicas/test_loop_graph.py checks the graph).
This module owns only the mechanics; what a step computes is the Trainer's.
"""

import contextlib
import time

from absl import logging
import numpy as np
import tensorflow as tf

from looper import autograph
from looper import errors
from looper.train import flops
from looper.options import precision


# The name scope of the replica function's ops (the graph test finds the
# loop's own ops as the ones outside it).
REPLICA_STEP = "replica_step"
_UNCOUNTED = object()  # TrainLoop's FLOPs and tokens before they are known


class TrainLoop:
  """Runs a `looper.train.trainer.Trainer`'s `train_step` (see module doc)."""

  def __init__(self, trainer):
    self._trainer = trainer
    # The input wait is timed unless op determinism forbids timestamps.
    self._timed = not trainer.config.train.deterministic
    self._make_loss_buffer(trainer.config.train.steps_per_loop)
    self._token_count = _UNCOUNTED  # see _tokens
    self._flops = _UNCOUNTED  # of one step, once traced (None: unknown)

  @property
  def _tokens(self) -> tf.Variable | None:
    """Sequences (int inputs [batch, length]): each replica adds up the
    tokens of its steps here (flops.tokens), read once per call; None for
    other inputs. Made by the first call, not with the loop: the data's
    spec is read then, so a bad split raises where the input is opened."""
    if self._token_count is _UNCOUNTED:
      self._token_count = None
      # Out of a trace, if in one: the spec may open a dataset of the data.
      with tf.init_scope():
        sequence = flops.is_sequence(self._trainer.input.element_spec)
      if sequence:
        with tf.init_scope(), self._trainer.strategy.scope():
          self._token_count = tf.Variable(
              0.0, trainable=False, name="tokens",
              synchronization=tf.VariableSynchronization.ON_READ,
              aggregation=tf.VariableAggregation.SUM)
    return self._token_count

  def _make_loss_buffer(self, steps: int) -> None:
    """Room for the per-step losses of a `steps`-step call (and the train
    function that writes them, traced anew).

    Each replica writes its share of step i's loss at [i]; reading the
    buffer after the loop sums the replicas once per call, not per step (a
    per-step reduction is a device-to-host wait per step on a GPU or TPU).
    The Controller's calls fit train.steps_per_loop, its initial size.
    """
    with self._trainer.strategy.scope():
      self._step_losses = tf.Variable(
          tf.zeros([steps]), trainable=False, name="step_losses",
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)
    self.function = tf.function(self._train_loop)

  def __call__(self, steps: int) -> tuple[np.ndarray, dict, bool]:
    """(per-step losses, metric results + input_wait_fraction, tokens and
    flops of the steps run, whether the weights are finite) of up to
    `steps` steps."""
    t = self._trainer
    if steps > self._step_losses.shape[0]:  # not from the Controller
      self._make_loss_buffer(steps)
    if t.stop.before_loop():  # some worker got a signal: all stop here
      return np.zeros([0], np.float32), {}, True
    # Before the trace: a variable made in a tf.function's first trace
    # makes it trace twice (the LM's loop: 8 s more on 2 replicas here).
    self._tokens  # pylint: disable=pointless-statement
    args = (t.input.train_iterator(),
            None if steps == 1 else tf.constant(steps, tf.int32))
    start = time.perf_counter()
    # A one-step call (the profiler window's) is marked as a step for the
    # Profile tab; a K-step call's while loop hides steps from it anyway,
    # so it skips the marker and the read of `step` it needs.
    with (tf.profiler.experimental.Trace(
        "train", step_num=t.global_step + 1, _r=1) if steps == 1
          else contextlib.nullcontext()):
      try:
        losses, finite, waited, results = self.function(*args)
      except tf.errors.InvalidArgumentError as e:  # XLA, or the data
        first = t.global_step + 1  # where the run is: saved up to before
        raise errors.step_error(
            e, jit_compile=t.config.train.jit_compile,
            field="data.train_split", split=t.config.data.train_split,
            where=f"of train steps {first}-{first + steps - 1}") from None
      losses = losses.numpy()  # waits for the call to finish
    logs = {k: float(v) for k, v in results.items()}
    if self._timed:
      logs["input_wait_fraction"] = float(waited) / max(
          time.perf_counter() - start, 1e-9)
    if self._flops is _UNCOUNTED:  # the call just traced it, if anyone did
      self._flops = flops.per_step(self.function.get_concrete_function(*args),
                                   t.strategy)
      logging.info("%s", flops.describe(self._flops))
    if self._flops is not None:
      logs["flops"] = len(losses) * self._flops
    return losses, logs, bool(finite)

  @autograph.plain
  def _train_loop(self, iterator, steps):
    """`steps` (an int32 tensor) steps in a tf.while_loop; steps=None: one
    step and no loop, which the profiler can see as a step (a while loop
    hides it: BUILD.md "TensorBoard"), for one-step calls.

    One process reads the stop flag each step: a host variable only the
    host writes, so reading it waits for nothing on a device.
    """
    t = self._trainer
    t.train_metrics.reset()
    if self._tokens is not None:
      self._tokens.assign(0.0)
    waited = tf.constant(0.0, tf.float64)  # seconds spent in get_next
    if steps is None:
      waited, ran = self._loop_step(iterator, 0, waited), 1
    else:
      def more(i, _):  # the stop flag is read before each step
        if not t.stop.cuts_loops:
          return i < steps
        return tf.logical_and(i < steps,
                              tf.logical_not(t.stop.flag.read_value()))
      ran, waited = tf.while_loop(
          more, lambda i, w: (i + 1, self._loop_step(iterator, i, w)),
          (tf.constant(0), waited))
    t.step.assign_add(tf.cast(ran, tf.int64))
    t.input.advance(ran * t.grad_accum_steps)
    # A finite loss does not prove finite weights (the last step's gradient
    # may not be): checked here so no NaN state is ever saved.
    finite = precision.finite_everywhere(t.strategy,
                                         t.model.trainable_variables)
    results = t.train_metrics.results()
    if self._tokens is not None:
      results["tokens"] = self._tokens.read_value()
    return self._step_losses.read_value()[:ran], finite, waited, results

  @autograph.plain
  def _loop_step(self, iterator, i, waited):
    """Step i of a train call: next batch, the replica step.

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
      batches = [next(iterator)
                 for _ in range(self._trainer.grad_accum_steps)]
    if self._timed:
      with tf.control_dependencies(tf.nest.flatten(batches,
                                                   expand_composites=True)):
        waited += tf.timestamp() - before[0]
    self._trainer.strategy.run(self._train_step, args=(i, *batches))
    return waited

  @autograph.plain
  def _train_step(self, i, *batches):
    """The replica function: the micro-batches of one update as one batch;
    this replica's share of the loss goes to its slot i of the buffer (its
    tokens, for sequences, to the tokens variable)."""
    with tf.name_scope(REPLICA_STEP):
      batch = (batches[0] if len(batches) == 1 else
               tf.nest.map_structure(lambda *t: tf.concat(t, 0), *batches))
      loss = self._trainer.train_step(batch)
      if self._tokens is not None:
        self._tokens.assign_add(flops.tokens(batch))
      # The whole buffer is written back: a slot of a TPU variable is a
      # tensor (TPU variables read their value as the operand), which has
      # no assign.
      self._step_losses.assign(tf.tensor_scatter_nd_update(
          self._step_losses, [[i]], [tf.cast(loss, tf.float32)]))
