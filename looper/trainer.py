"""The Trainer: model, optimizer and metrics in scope; the train and eval loops.

Synopsis::

    trainer = Trainer(config, strategy)
    losses, logs = trainer.train(steps=100)   # one tf.function call
    eval_logs = trainer.evaluate()            # the whole eval split

The Trainer owns its train iterator and data position (global examples
consumed, checkpointed): `train` opens the stream where the position says,
`seek` moves it (to skip data), `roll_back` restores a checkpoint but keeps
the data position. One `train` call, all inside one tf.function (no host
sync per step)::

    reset train metrics
    for i in range(steps):                     # a tf.while_loop; steps: an
      if stop requested: break                 # int32 tensor; the stop:
                                               # request_stop(), any thread
      batch = next(iterator)                   # train.grad_accum_steps
                                               # batches, concatenated
      strategy.run(train_step, batch)          # each replica writes its
                                               # share of the loss to its
                                               # buffer slot i
    step += steps run; position += steps run * global_batch_size
    return losses (the buffers summed over replicas, once: the global mean
      loss of each step), train metric results + input_wait_fraction (the
      share of the call spent waiting for batches)

One replica's step (`train_step`, which the loop calls) is three seams::

    micro = micro_batches(batch)   # grad_accum_steps (inputs, labels, weights)
    total = weight_total(micro)    # loss_normalization='weights': all replicas
    for inputs, labels, weights in micro:
      loss, grads, logits = compute_gradients(inputs, labels, weights,
                                              total)            # summed
    grads = transform_gradients(grads)   # e.g. the finiteness vote
    apply_gradients(grads)               # the optimizer sums over replicas
                                         # (then optimizer.clip_global_norm
                                         # clips the sum)

A subclass (`config.trainer`) overrides one small method and inherits the
loop, distribution and bookkeeping: `build_model`, `build_optimizer`,
`build_metrics`, `compute_loss`, the three seams, `train_step`,
`eval_step`, `update_metrics`, `serve`, `on_loop_end`, `checkpoint_items`.
The traced methods are plain TensorFlow (no AutoGraph rewrite, as in Keras
3's fit); a subclass's override of one is converted by AutoGraph, so it
may branch on tensors (`conversion`).
Side concerns have modules of their own: the weight average (`ema`), the
stop request and vote (`stopping`), the input check before a run (`probe`).
"""

import contextlib
import time
from typing import Any

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from looper import conversion
from looper import ema as ema_lib
from looper import errors
from looper import objectives
from looper import optimizers
from looper import precision
from looper import refs
from looper import stopping
from looper.data import checks
from looper.data import elements
from looper.data import sources
from looper.data import splits


# The name scope of the replica function's ops (the graph test finds the
# loop's own ops as the ones outside it).
REPLICA_STEP = "replica_step"


class Trainer:
  """Builds the training state in `strategy.scope()` and runs the loops."""

  # The methods the traced loops run are `conversion.plain`: never
  # rewritten by AutoGraph (20-200 ms per function, most of the first
  # trace: BUILD.md "first loop"); a subclass's override of one is.
  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    conversion.convert_overrides(cls, Trainer)

  def __init__(self, config: ml_collections.ConfigDict,
               strategy: tf.distribute.Strategy):
    self.config = config
    self.strategy = strategy
    # Examples per optimizer update: grad_accum_steps batches of
    # train.batch_size (what the loss is averaged over).
    self.grad_accum_steps = config.train.grad_accum_steps
    self.global_batch_size = config.train.batch_size * self.grad_accum_steps
    replicas = strategy.num_replicas_in_sync
    checks.check_divisible(config.train.batch_size, replicas,
                           "train.batch_size")
    checks.check_divisible(config.eval.batch_size, replicas, "eval.batch_size")
    self._micro_rows = config.train.batch_size // replicas  # static shape
    self.model_fn = refs.resolve(config.model_fn, "model_fn")
    self.dataset_fn = refs.resolve(config.dataset_fn, "dataset_fn")
    self._loss_fn = objectives.losses(config.loss)
    # data.class_weights as a table by class id (None: off).
    self._class_weights = objectives.class_weight_table(
        config.data.class_weights)
    # Built on the first evaluate(): counting the split may take a pass.
    self._eval_plan = None  # (examples, steps, iterator) of the eval split
    self._sources = {}  # split -> its input source, made once
    self._iterator = None  # opened by train() at the data position
    self._stop = stopping.StopFlag(strategy)
    # The input wait is timed unless op determinism forbids timestamps.
    self._timed = not config.train.deterministic
    self.weights_finite = True  # after the last train loop

    # Same seed, same initial weights: whatever the replica count.
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
      with precision.policy(config.train.precision):
        self.model = self.build_model()
      self.optimizer = precision.wrap(self.build_optimizer(),
                                      config.train.precision)
      if config.optimizer.clip_global_norm:  # after the replicas' sum
        optimizers.clip_after_sum(self.optimizer,
                                  config.optimizer.clip_global_norm)
      # Keras 3 creates slots lazily; under >1 replica that fails inside the
      # loop ("must feed a value for placeholder"), so build them here.
      self.optimizer.build(self.model.trainable_variables)
      # optimizer.ema_decay: eval and export use the average (see ema).
      self.ema = (ema_lib.WeightAverage(self.model.trainable_variables,
                                        config.optimizer.ema_decay)
                  if config.optimizer.ema_decay else None)
      self.train_metrics = self.build_metrics()
      self.eval_metrics = self.build_metrics()
      self.eval_loss = objectives.EvalLoss(
          config.loss, config.loss_normalization, config.loss_weights)
      counter = dict(dtype=tf.int64, trainable=False,
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.step = tf.Variable(0, name="step", **counter)
      # Global examples consumed: where the train data resumes.
      self.position = tf.Variable(0, name="position", **counter)
    self._make_loss_buffer(config.train.steps_per_loop)
    # XLA compiles the per-replica forward and backward pass only: around
    # the whole loop it cannot (the iterator), around the update it fails
    # under Mirrored (variables on other devices), and it was slower here.
    self._compute_gradients = (
        tf.function(self.compute_gradients, jit_compile=True)
        if config.train.jit_compile else self.compute_gradients)
    self._eval_fn = tf.function(self._eval_loop)

  def _make_loss_buffer(self, steps: int) -> None:
    """Room for the per-step losses of a `steps`-step call (and the train
    function that writes them, traced anew).

    Each replica writes its share of step i's loss at [i]; reading the
    buffer after the loop sums the replicas once per call, not per step (a
    per-step reduction is a device-to-host wait per step on a GPU or TPU).
    The Controller's calls fit train.steps_per_loop, its initial size.
    """
    with self.strategy.scope():
      self._step_losses = tf.Variable(
          tf.zeros([steps]), trainable=False, name="step_losses",
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)
    self._train_fn = tf.function(self._train_loop)

  # --- What a subclass overrides --------------------------------------------

  def build_model(self) -> keras.Model:
    """The experiment's model; built on one example if it is not yet."""
    model = self.model_fn(self.config)
    if not model.built:
      inputs, _ = self.examples(self.config.data.train_split).element_spec
      model(tf.nest.map_structure(  # size 1 for a variable length
          lambda s: tf.zeros([1] + [d or 1 for d in s.shape], s.dtype),
          inputs))
    return model

  def build_optimizer(self) -> keras.optimizers.Optimizer:
    return optimizers.build(self.config.optimizer, self.config.train.steps,
                            self.global_batch_size)

  def build_metrics(self) -> objectives.Metrics:
    """Fresh metric objects, keyed by their log names (config.metrics);
    called once for train and once for eval."""
    return objectives.Metrics(self.config.metrics)

  @conversion.plain
  def compute_loss(self, labels, logits):
    """Per-example (or per-token) losses, shape [batch, ...]; a dict of them
    by output if config.loss is a dict. Weighted and averaged by the
    caller (`average_loss`)."""
    return objectives.apply(self._loss_fn, labels, logits)

  @conversion.plain
  def average_loss(self, values, weights=None, weight_total=None):
    """This replica's share of the global batch's loss from the losses
    `compute_loss` returned (config.loss_normalization, loss_weights)."""
    return objectives.average(
        values, weights, weight_total, loss_weights=self.config.loss_weights,
        normalization=self.config.loss_normalization,
        global_batch_size=self.global_batch_size)

  @conversion.plain
  def train_step(self, batch) -> tf.Tensor:
    """One replica's update; returns its share of the global mean loss.

    `batch` is this replica's part of one update: train.grad_accum_steps
    micro-batches concatenated (the examples of a batch grad_accum_steps
    times larger). The default sums the gradients of its micro-batches and
    applies them once, so the update is that of the larger batch.
    """
    micro = self.micro_batches(batch)
    total = self.weight_total([weights for _, _, weights in micro])
    loss, grads = 0.0, None
    for inputs, labels, weights in micro:  # unrolled: k is small
      # Unweighted: the two-argument call an older subclass overrides.
      weighting = () if weights is None else (weights, total)
      part, part_grads, logits = self._compute_gradients(inputs, labels,
                                                         *weighting)
      self.update_metrics(self.train_metrics, labels, logits, weights)
      loss += part
      grads = part_grads if grads is None else [
          optimizers.add(g, h) for g, h in zip(grads, part_grads)]
    self.apply_gradients(self.transform_gradients(grads))
    if self.ema:
      self.ema.update()
    return loss

  @conversion.plain
  def micro_batches(self, batch) -> list:
    """`batch` cut back into its train.grad_accum_steps micro-batches, each
    of train.batch_size / replicas examples (static slices), as
    (inputs, labels, weights): the examples' weights times
    data.class_weights, None if there are neither."""
    rows = self._micro_rows
    parts = []
    for i in range(self.grad_accum_steps):
      inputs, labels, weights = checks.parts(tf.nest.map_structure(
          lambda t, i=i: t[i * rows:(i + 1) * rows], batch))
      parts.append((inputs, labels, objectives.class_weighted(
          weights, labels, self._class_weights)))
    return parts

  @conversion.plain
  def weight_total(self, weights: list):
    """The sum of an update's example weights over all its micro-batches
    and replicas (one scalar all-reduce per step), which
    loss_normalization='weights' divides by; None when not needed."""
    if (self.config.loss_normalization != "weights" or weights[0] is None):
      return None
    local = tf.nest.map_structure(
        lambda *w: tf.add_n([tf.reduce_sum(x) for x in w]), *weights)
    return tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, local)

  @conversion.plain
  def compute_gradients(self, inputs, labels, weights=None,
                        weight_total=None):
    """One replica's (loss, gradients, float32 logits).

    The loss is this replica's share of the global mean (summed over
    replicas it is the mean over the global batch), so the gradients sum,
    not average, across replicas. `weights`: the examples' (or tokens')
    weights; `weight_total`: their sum over the update (`weight_total`).
    Under mixed_float16 the gradients are of the scaled loss (the optimizer
    unscales them). With train.jit_compile this method is what XLA
    compiles.
    """
    with tf.GradientTape() as tape:
      logits = _float32(self.model(inputs, training=True))
      loss = self.average_loss(self.compute_loss(labels, logits), weights,
                               weight_total)
      if self.model.losses:  # regularizers: once per update, not per
        # replica or micro-batch
        loss += tf.nn.scale_regularization_loss(
            tf.add_n(self.model.losses)) / self.grad_accum_steps
      scaled = precision.scale_loss(self.optimizer, loss)
    return loss, tape.gradient(scaled, self.model.trainable_variables), logits

  @conversion.plain
  def transform_gradients(self, grads):
    """This replica's gradients before the update; the optimizer then sums
    them over replicas (and clips the sum: optimizer.clip_global_norm).
    Looper's: dense gradients under data.bucket and the all-replica
    finiteness vote under loss scaling."""
    if self.config.data.bucket:
      # Sparse gradients (an Embedding's IndexedSlices, a row per token)
      # change size with the batch's length; several replicas all-gather
      # them inside the train loop, and TensorFlow aborts when
      # successive gathers differ ("Shape mismatch in the collective
      # instance"). Dense ones have their variable's shape in every step.
      grads = [tf.convert_to_tensor(g) for g in grads]
    return precision.skip_unless_finite_everywhere(self.optimizer, grads)

  @conversion.plain
  def apply_gradients(self, grads) -> None:
    """The optimizer update: it sums `grads` over replicas first (one
    all-reduce per step) and clips the sum (optimizer.clip_global_norm)."""
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

  @conversion.plain
  def eval_step(self, batch) -> None:
    """One replica's eval step; padding examples have mask 0. The examples'
    own weights count (data.class_weights, a train-time rebalancing, does
    not, as in Keras). An override feeds `self.eval_loss` (what `evaluate`
    reports as the loss and the example count) and the eval metrics."""
    *example, mask = batch
    inputs, labels, weights = checks.parts(example)
    logits = _float32(self.model(inputs, training=False))
    self.eval_loss.update(self.compute_loss(labels, logits), weights, mask)
    self.update_metrics(self.eval_metrics, labels, logits,
                        objectives.masked(weights, mask))

  @conversion.plain
  def update_metrics(self, metrics, labels, logits, sample_weight=None):
    """Updates `metrics` (an objectives.Metrics) with a batch."""
    metrics.update(labels, logits, sample_weight)

  @conversion.plain
  def serve(self, inputs) -> dict[str, tf.Tensor]:
    """What an export computes for a batch of `inputs` (see looper.export):
    {"logits": ...}, or every output of a model with a dict of them.

    Override to serve probabilities, decoded labels or preprocessing; the
    model's variables are the only state an export may use.
    """
    outputs = self.model(inputs, training=False)
    return dict(outputs) if isinstance(outputs, dict) else {"logits": outputs}

  def on_loop_end(self, step: int, logs: dict[str, float]) -> None:
    """Host-side hook after every train loop, with the logs just written."""

  # --- Data -------------------------------------------------------------------

  def source(self, split: str) -> sources.Source:
    """`split`'s input source (see `sources`): what dataset_fn returned."""
    if split not in self._sources:
      self._sources[split] = sources.make(
          split, splits.split_field(self.config, split), self.config.data,
          lambda: self.dataset_fn(self.config, split))
    return self._sources[split]

  def examples(self, split: str) -> tf.data.Dataset:
    """One pass over `split` as (inputs, label) examples, checked."""
    return checks.checked(self.source(split).examples(), split,
                          variable=bool(self.config.data.bucket))

  def train_data(self) -> tf.distribute.DistributedDataset:
    """Distributed train batches from the current data position on."""
    c = self.config
    source = self.source(c.data.train_split)
    source.check(self.strategy.num_replicas_in_sync, c.train.batch_size,
                 "train.batch_size")
    position = int(self.position.numpy())
    return self.strategy.distribute_datasets_from_function(
        lambda ctx: self._endless(source.train(
            ctx, global_batch_size=c.train.batch_size, seed=c.seed,
            shuffle_buffer=c.data.shuffle_buffer, position=position)))

  def _endless(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`, which never ends, declared so where it matters: with
    several workers (or TPU hosts), tf.distribute asks every worker on
    each get_next whether it still has data (an all-reduce across them,
    its get_next_as_optional) for any stream whose end tf.data cannot see
    (flat_map, rebatch: all of looper's). Not in one process, where the
    check is never on for static shapes: there, freeing several Trainers'
    Mirrored iterators stalled 20 s or more with and without it, and in
    one measurement only with it."""
    if not self.strategy.extended._in_multi_worker_mode():  # pylint: disable=protected-access
      return dataset
    return dataset.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY))

  def seek(self, position: int) -> None:
    """Reopens the train stream at `position` global examples."""
    self.position.assign(position)
    self._iterator = None

  def roll_back(self, checkpointer) -> str | None:
    """Restores the latest checkpoint (its path, or None if there is none)
    but keeps the data position: the data since is skipped (NaN recovery)."""
    skip_to = self.data_position
    path = checkpointer.restore()
    if path:
      self.seek(skip_to)
    return path

  # --- The loops --------------------------------------------------------------

  @property
  def global_step(self) -> int:
    """Optimizer updates done so far (restored with the checkpoint)."""
    return int(self.step.numpy())

  @property
  def data_position(self) -> int:
    """Global train examples consumed so far (restored with the checkpoint)."""
    return int(self.position.numpy())

  def train(self, steps: int) -> tuple[np.ndarray, dict]:
    """Runs `steps` steps in one call; returns per-step losses and metrics.

    Fewer losses than `steps` come back if `request_stop` was called.
    """
    if steps > self._step_losses.shape[0]:  # not from the Controller
      self._make_loss_buffer(steps)
    if self._stop.before_loop():  # some worker got a signal: all stop here
      return np.zeros([0], np.float32), {}
    if self._iterator is None:
      self._iterator = iter(self.train_data())
    start = time.perf_counter()
    # A one-step call (the profiler window's) is marked as a step for the
    # Profile tab; a K-step call's while loop hides steps from it anyway,
    # so it skips the marker and the read of `step` it needs.
    with (tf.profiler.experimental.Trace(
        "train", step_num=self.global_step + 1, _r=1) if steps == 1
          else contextlib.nullcontext()):
      try:
        losses, finite, waited, results = self._train_fn(
            self._iterator,
            None if steps == 1 else tf.constant(steps, tf.int32))
      except tf.errors.InvalidArgumentError as e:  # XLA, or the data
        compiled = errors.compile_error(
            e, jit_compile=self.config.train.jit_compile)
        if compiled:
          raise compiled from None
        first = self.global_step + 1  # where the run is: saved up to before
        raise errors.data_error(
            e, field="data.train_split", split=self.config.data.train_split,
            where=f"of train steps {first}-{first + steps - 1}") from None
      losses = losses.numpy()  # waits for the call to finish
    logs = {k: float(v) for k, v in results.items()}
    if self._timed:
      logs["input_wait_fraction"] = float(waited) / max(
          time.perf_counter() - start, 1e-9)
    self.weights_finite = bool(finite)
    return losses, logs

  # Stopping: see `stopping.StopFlag`.

  def agree(self, flag: bool) -> bool:
    """True if `flag` is true on any worker; every worker calls it alike."""
    return self._stop.agree(flag)

  @property
  def stop_requested(self) -> bool:
    """Whether training stops: `request_stop` was called and took effect."""
    return self._stop.requested

  def request_stop(self) -> None:
    """Stops a running (or the next) train loop; safe from any thread."""
    self._stop.request()

  @conversion.plain
  def _train_loop(self, iterator, steps):
    """`steps` (an int32 tensor) steps in a tf.while_loop; steps=None: one
    step and no loop, which the profiler can see as a step (a while loop
    hides it: BUILD.md "TensorBoard"), for one-step calls.

    The loop body is `next(iterator)` and the replica step, as in the TPU
    guide's loop: nothing in it reads the model or optimizer state or
    reduces across replicas (tests/test_loop_graph.py checks the graph).
    One process reads the stop flag each step: a host variable only the
    host writes, so reading it waits for nothing on a device.
    """
    self.train_metrics.reset()
    waited = tf.constant(0.0, tf.float64)  # seconds spent in get_next
    if steps is None:
      waited, ran = self._loop_step(iterator, 0, waited), 1
    else:
      def more(i, _):  # the stop flag is read before each step
        if not self._stop.cuts_loops:
          return i < steps
        return tf.logical_and(i < steps,
                              tf.logical_not(self._stop.flag.read_value()))
      ran, waited = tf.while_loop(
          more, lambda i, w: (i + 1, self._loop_step(iterator, i, w)),
          (tf.constant(0), waited))
    self.step.assign_add(tf.cast(ran, tf.int64))
    self.position.assign_add(tf.cast(ran, tf.int64) * self.global_batch_size)
    # A finite loss does not prove finite weights (the last step's gradient
    # may not be): checked here so no NaN state is ever saved. Each replica
    # checks its own copy where it lives: read here, on the host, every
    # weight would cross from an accelerator once per loop.
    finite = self.strategy.reduce(
        tf.distribute.ReduceOp.SUM, self.strategy.run(self._weights_bad),
        axis=None) == 0
    return (self._step_losses.read_value()[:ran], finite, waited,
            self.train_metrics.results())

  @conversion.plain
  def _weights_bad(self):
    """1 if this replica's weights hold a NaN or inf, else 0."""
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                            for v in self.model.trainable_variables])
    return tf.cast(tf.logical_not(finite), tf.int32)

  @conversion.plain
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
      batches = [next(iterator) for _ in range(self.grad_accum_steps)]
    if self._timed:
      with tf.control_dependencies(tf.nest.flatten(batches,
                                                   expand_composites=True)):
        waited += tf.timestamp() - before[0]
    self.strategy.run(self._train_step, args=(i, *batches))
    return waited

  @conversion.plain
  def _train_step(self, i, *batches):
    """The replica function: the micro-batches of one update as one batch;
    this replica's share of the loss goes to its slot i of the buffer."""
    with tf.name_scope(REPLICA_STEP):
      loss = self.train_step(batches[0] if len(batches) == 1 else
                             tf.nest.map_structure(
                                 lambda *t: tf.concat(t, 0), *batches))
      # The whole buffer is written back: a slot of a TPU variable is a
      # tensor (TPU variables read their value as the operand), which has
      # no assign.
      self._step_losses.assign(tf.tensor_scatter_nd_update(
          self._step_losses, [[i]], [tf.cast(loss, tf.float32)]))

  def evaluate(self) -> dict[str, float]:
    """Evaluates the whole eval split (or `eval.steps` batches) exactly once.

    Returns:
      'loss', each metric, and 'examples': how many real examples counted.
    """
    c = self.config
    if self._eval_plan is None:
      source = self.source(c.data.eval_split)
      size = source.size or checks.num_examples(source.examples(),
                                                c.data.eval_split)
      count, steps = elements.eval_plan(size, c.eval.batch_size,
                                        c.eval.steps)
      # One iterator over the eval pass repeated, kept: each evaluation
      # takes exactly one pass. A fresh iterator per evaluation ran a third
      # of them at half speed on this CPU (Keras fit's too; BUILD.md).
      self._eval_plan = count, steps, iter(
          self.strategy.distribute_datasets_from_function(
              lambda ctx: self._endless(source.eval(
                  ctx, global_batch_size=c.eval.batch_size, count=count,
                  steps=steps).repeat())))
    count, steps, iterator = self._eval_plan
    where = f"of the evaluation at step {self.global_step}"
    # Until a whole pass is taken, the next evaluation starts afresh.
    self._eval_plan = None
    with self.averaged_weights():
      try:
        results = self._eval_fn(iterator, tf.constant(steps, tf.int32))
      except tf.errors.InvalidArgumentError as e:
        raise (errors.compile_error(e, jit_compile=False) or
               errors.data_error(e, field="data.eval_split",
                                 split=c.data.eval_split,
                                 where=where)) from None
      results = {k: float(v) for k, v in results.items()}
    if results["examples"] != count:  # the split changed under the run
      raise errors.DataError(
          f"config.data.eval_split={c.data.eval_split!r} gave"
          f" {results['examples']:.0f} examples {where}, where {count} were"
          " counted before it: make config.dataset_fn return the same"
          " examples on every pass")
    self._eval_plan = count, steps, iterator
    return results

  @property
  def eval_metric_names(self) -> list[str]:
    """What `evaluate` reports besides 'loss' and 'examples': each output's
    loss (a dict of outputs) and each metric, by log name."""
    return self.eval_loss.output_names + self.eval_metrics.names

  def averaged_weights(self):
    """A context in which the model holds the moving average of its weights
    (eval, export); no-op without optimizer.ema_decay."""
    return self.ema.swapped() if self.ema else contextlib.nullcontext()

  @conversion.plain
  def _eval_loop(self, iterator, steps):
    self.eval_loss.reset()
    self.eval_metrics.reset()
    def one_batch(i):
      self.strategy.run(self.eval_step, args=(next(iterator),))
      return i + 1
    tf.while_loop(lambda i: i < steps, one_batch, (tf.constant(0),))
    return {**self.eval_loss.results(), **self.eval_metrics.results()}

  # --- State ------------------------------------------------------------------

  def learning_rate(self) -> float:
    """The optimizer's current learning rate (schedules included)."""
    return float(tf.convert_to_tensor(self.optimizer.learning_rate))

  def checkpoint_items(self) -> dict[str, Any]:
    """What a checkpoint holds; a subclass may add its own trackables."""
    # The inner optimizer under loss scaling: its slots are the same in
    # every precision, so checkpoints move between precisions. The dynamic
    # loss scale is not saved; it re-grows within a few hundred steps.
    items = dict(model=self.model, optimizer=precision.inner(self.optimizer),
                 step=self.step, position=self.position)
    if self.ema:
      items["ema"] = self.ema.averages
    return items


@conversion.plain
def _float32(outputs):
  """The model's outputs (a tensor or a dict of them) as float32: losses
  and metrics run in float32 under any precision policy."""
  return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)

