"""The Trainer: model, optimizer and metrics in scope; the step seams.

Synopsis (what looper.run.Run builds, through looper.run.pieces)::

    trainer = pieces.trainer(config, strategy, data, batch,
                             steps_per_loop=100)  # Trainer(config, ...,
                                                  # options=StepOptions(...))
    values, logs = trainer.train(steps=100)    # one tf.function call
    trainer = run.Run(config, workdir).trainer  # a notebook's: nothing written

One `train` call runs `steps` steps inside one tf.function
(`looper.train.loop.TrainLoop`, built from `train_step`: no host sync per
step) on the `Input` the caller gives, and returns each step's values (its
global mean loss, and what `train_step` returns beside it). The Trainer
reads its own blocks of the config (model_fn, loss, loss_weights,
loss_normalization, metrics, optimizer); how its step is made around the
math (precision, XLA, clipping, sharding, the weight average:
`StepOptions`) and its stop request come from the run, which also
restores checkpoints, rolls back and evaluates (looper.run.pieces.evaluator).

One replica's step (`train_step`) is three seams::

    for inputs, labels, weights in micro_batches(batch):
      loss, grads, logits = compute_gradients(...)   # summed
    apply_gradients(transform_gradients(grads))      # the optimizer sums
                                                     # over replicas, clips

A subclass (`config.trainer`) overrides one small method and inherits the
loop, distribution and bookkeeping: `build_model`, `build_optimizer`,
`build_metrics`, `compute_loss`, the three seams, `train_step`,
`eval_step`, `update_metrics`, `serve`, `on_loop_end`, `checkpoint_items`.
A subclass's override of a traced method is converted by AutoGraph, so it
may branch on tensors; looper's own are plain TensorFlow (`conversion`).
"""

from typing import Any

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from looper import autograph
from looper import errors
from looper import references
from looper.data import batch as batch_lib
from looper.data import input as input_lib
from looper.options import losses
from looper.options import metrics
from looper.options import optimizers
from looper.options import precision
from looper.measure import flops
from looper.measure import health
from looper.train import loop
from looper.train import randomness
from looper.train import stopping
from looper.train import weighting as weighting_lib
from looper.train.step_options import StepOptions


class Trainer:
  """Builds the training state in `strategy.scope()` and runs the loops.

  Args (looper.run.pieces.trainer gives each from its block):
    config: the experiment's; the Trainer reads its own blocks, a subclass
      and model_fn the rest.
    strategy, input, batch: the run's strategy, data and batch numbers.
    steps_per_loop: the longest train call; total_steps: the schedule's.
    options: how the step is made (`StepOptions`; default: plain).
    stop: the run's stop request (`stopping.StopFlag`; default: its own).
    timed: the loop times its input wait (not under op determinism).
    settable_rate: a Keras callback may set the rate: the schedule reads
      `learning_rate_scale`.
  """

  # The methods the traced loops run are `autograph.plain`: never
  # rewritten by AutoGraph (20-200 ms per function, most of the first
  # trace: BUILD.md "first loop"); a subclass's override of one is.
  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    autograph.convert_overrides(cls, Trainer)

  def __init__(self, config: ml_collections.ConfigDict,
               strategy: tf.distribute.Strategy,
               input: input_lib.Input,  # pylint: disable=redefined-builtin
               batch: batch_lib.Batch, *, steps_per_loop: int,
               total_steps: int, options: StepOptions = StepOptions(),
               stop: stopping.StopFlag | None = None, timed: bool = True,
               settable_rate: bool = False):
    self.config = config
    self.strategy = strategy
    self.input = input  # the data (looper.data.input)
    # The batch's numbers (looper.data.batch): what an update averages
    # over, its micro-batches, a replica's rows of each.
    self.batch = batch
    self.total_steps = total_steps
    self.model_fn = references.resolve(config.model_fn, "model_fn")
    self._loss_fn = losses.losses(config.loss)
    # How an update's examples weigh in its loss (looper.train.weighting).
    self.weighting = weighting_lib.Weighting(
        config.loss, config.loss_normalization, config.loss_weights,
        class_weights=options.class_weights, batch=batch)
    self._dense_gradients = options.dense_gradients
    self._jit_compile = options.jit_compile  # named by a step's error
    self._settable_rate = settable_rate
    # Stops a running loop (`stopping`): request(), agree(), requested.
    self.stop = stop or stopping.StopFlag(strategy)
    self.weights_finite = True  # after the last train loop

    with strategy.scope():
      with options.policy():
        self.model = self.build_model()
      # Keras' random layers: replica-invariant draws and their state in
      # the checkpoint, whatever build_model made (looper.train.randomness).
      self.random = randomness.adopt(self.model, rows=batch.per_replica)
      # The schedule's factor: 1 unless a Keras callback sets the rate
      # (looper.control.callbacks checkpoints it with the callbacks' state).
      self.learning_rate_scale = tf.Variable(
          1.0, trainable=False, name="learning_rate_scale")
      self.optimizer = options.wrap(self.build_optimizer())
      # Weight and gradient norms per loop (measure/health), or None.
      self.health = options.watch(strategy, self.model.trainable_variables)
      optimizers.after_sum(  # the summed gradient's norm: clipped by, logged
          self.optimizer, clip_norm=options.clip_norm,
          observe=self.health.observe if options.grad_norm else None)
      # The slots built now, in scope (1/N per replica if sharded).
      self.update = options.updater(
          self.optimizer, self.model.trainable_variables, strategy)
      self.ema = options.average(self.update)  # what eval and export use
      self.train_metrics = self.build_metrics()
      self.eval_metrics = self.build_metrics()
      self.eval_loss = losses.EvalLoss(
          config.loss, self.weighting.normalization, config.loss_weights)
      counter = dict(dtype=tf.int64, trainable=False,
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.step = tf.Variable(0, name="step", **counter)
    # The loop is built from this Trainer's step (its seam) and holds no
    # Trainer: the per-loop work is given to it as two small functions.
    step = loop.by_name(self.train_step, type(self).__name__)
    self._loop = loop.TrainLoop(
        self.health.around(step) if self.health else step, strategy=strategy,
        stop=self.stop, steps_per_loop=steps_per_loop, step=self.step,
        iterator=input.train_iterator, weights=self.model.trainable_variables,
        batches_per_step=batch.accum_steps, on_start=self._loop_start,
        on_end=self._loop_end,
        sequences=lambda: flops.is_sequence(input.element_spec),
        timed=timed)
    # XLA compiles the per-replica forward and backward pass only: around
    # the whole loop it cannot (the iterator), around the update it fails
    # under Mirrored (variables on other devices), and it was slower here.
    self._compute_gradients = (
        tf.function(self.compute_gradients, jit_compile=True)
        if options.jit_compile else self.compute_gradients)

  # --- What a subclass overrides --------------------------------------------

  def build_model(self) -> keras.Model:
    """The experiment's model; built on one example if it is not yet."""
    model = self.model_fn(self.config)
    if not model.built:
      inputs = batch_lib.parts(self.input.element_spec)[0]
      model(tf.nest.map_structure(  # size 1 for a variable length
          lambda s: tf.zeros([1] + [d or 1 for d in s.shape], s.dtype),
          inputs))
    return model

  def build_optimizer(self) -> keras.optimizers.Optimizer:
    # The scale only where a Keras callback may set the rate: a step without
    # it ran 0.6-2% faster (BUILD.md, "Keras callbacks").
    return optimizers.build(
        self.config.optimizer, self.total_steps,
        self.batch.global_batch_size,
        scale=self.learning_rate_scale if self._settable_rate else None)

  def build_metrics(self) -> metrics.Metrics:
    """Fresh metric objects, keyed by their log names (config.metrics);
    called once for train and once for eval."""
    return metrics.Metrics(self.config.metrics)

  @autograph.plain
  def compute_loss(self, labels, logits):
    """Per-example (or per-token) losses, shape [batch, ...]; a dict of them
    by output if config.loss is a dict. Weighted and averaged by the
    caller (`average_loss`)."""
    return losses.apply(self._loss_fn, labels, logits)

  @autograph.plain
  def average_loss(self, values, weights=None, weight_total=None):
    """This replica's share of the global batch's loss from the losses
    `compute_loss` returned (loss_normalization, loss_weights)."""
    return self.weighting.average(values, weights, weight_total)

  @autograph.plain
  def train_step(self, batch) -> tf.Tensor | dict[str, tf.Tensor]:
    """One replica's update; returns its share of the global mean loss, or
    a dict of per-step scalars with it as 'loss' (README "Per-step values").

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

  @autograph.plain
  def micro_batches(self, batch) -> list:
    """`batch` cut back into its micro-batches (train.grad_accum_steps) as
    (inputs, labels, weights): the examples' weights times
    data.class_weights and 0 on a loss object's ignore_class, None if
    there are none (looper.train.weighting)."""
    return self.weighting.micro_batches(batch)

  @autograph.plain
  def weight_total(self, weights: list):
    """The sum of an update's example weights over all its micro-batches
    and replicas (one scalar all-reduce per step), which
    loss_normalization='weights' divides by; None when not needed."""
    return self.weighting.total(weights)

  @autograph.plain
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
            tf.add_n(self.model.losses)) / self.batch.accum_steps
      scaled = precision.scale_loss(self.optimizer, loss)
    return loss, tape.gradient(scaled, self.model.trainable_variables), logits

  @autograph.plain
  def transform_gradients(self, grads):
    """This replica's gradients before the update; the optimizer then sums
    them over replicas (and clips the sum: optimizer.clip_global_norm).
    Looper's: dense gradients under data.bucket and the all-replica
    finiteness vote under loss scaling."""
    if self._dense_gradients:
      # Sparse gradients (an Embedding's IndexedSlices, a row per token)
      # change size with the batch's length; several replicas all-gather
      # them inside the train loop, and TensorFlow aborts when
      # successive gathers differ ("Shape mismatch in the collective
      # instance"). Dense ones have their variable's shape in every step.
      grads = [tf.convert_to_tensor(g) for g in grads]
    return precision.skip_unless_finite_everywhere(self.optimizer, grads)

  @autograph.plain
  def apply_gradients(self, grads) -> None:
    """The optimizer update: it sums `grads` over replicas first (one
    all-reduce per step) and clips the sum (optimizer.clip_global_norm)."""
    self.update.apply(grads)

  @autograph.plain
  def eval_step(self, batch) -> None:
    """One replica's eval step; padding examples have mask 0. Examples' own
    weights and a loss object's ignore_class count (data.class_weights, a
    train-time rebalancing, does not, as in Keras). An override feeds
    `self.eval_loss` (`evaluate`'s loss and example count) and the metrics."""
    *example, mask = batch
    inputs, labels, weights = batch_lib.parts(example)
    weights = losses.label_weighted(weights, labels,
                                    ignored=self.weighting.ignored)
    logits = _float32(self.model(inputs, training=False))
    self.eval_loss.update(self.compute_loss(labels, logits), weights, mask)
    self.update_metrics(self.eval_metrics, labels, logits,
                        losses.masked(weights, mask))

  @autograph.plain
  def update_metrics(self, metrics, labels, logits, sample_weight=None):
    """Updates `metrics` (a looper.options.metrics.Metrics) with a batch."""
    metrics.update(labels, logits, sample_weight)

  @autograph.plain
  def serve(self, inputs) -> dict[str, tf.Tensor]:
    """What an export computes for a batch of `inputs` (looper.workdir.export):
    {"logits": ...}, or every output of a model with a dict of them.

    Override to serve probabilities, decoded labels or preprocessing; the
    model's variables are the only state an export may use.
    """
    outputs = self.model(inputs, training=False)
    return dict(outputs) if isinstance(outputs, dict) else {"logits": outputs}

  def on_loop_end(self, step: int, logs: dict[str, float]) -> None:
    """Host-side hook after every train loop, with the logs just written."""

  # --- The loop ---------------------------------------------------------------

  @property
  def global_step(self) -> int:
    """Optimizer updates done so far (restored with the checkpoint)."""
    return int(self.step.numpy())

  @property
  def global_batch_size(self) -> int:
    """One update's examples over all replicas: what the loss is averaged
    over (`tf.nn.compute_average_loss(..., global_batch_size=)`)."""
    return self.batch.global_batch_size

  def train(self, steps: int) -> tuple[dict[str, np.ndarray], dict]:
    """Runs up to `steps` steps in one call (`loop.TrainLoop`, fewer on a
    stop: `self.stop`); returns each step's values by name, and the logs."""
    try:
      values, logs, self.weights_finite = self._loop(steps)
    except tf.errors.InvalidArgumentError as e:  # XLA, or the data
      first = self.global_step + 1  # where the run is: saved up to before
      raise errors.step_error(
          e, jit_compile=self._jit_compile, field="data.train_split",
          split=self.input.train_split,
          where=f"of train steps {first}-{first + steps - 1}") from None
    if not isinstance(values, dict):  # stopped before the step's first trace
      values = {"loss": values}
    values.pop(health.SQUARES, None)  # the health figures are in the logs
    return values, logs

  @autograph.plain
  def _loop_start(self) -> None:
    """In the train function, before its steps."""
    self.train_metrics.reset()
    self.update.refresh()  # sharded: the shards from the weights
    if self.health:
      self.health.start()

  @autograph.plain
  def _loop_end(self, ran, values) -> dict:
    """In the train function, after `ran` steps of `values`: the data they
    consumed (the checkpoint's position), the train metrics, the health's."""
    self.input.advance(ran * self.batch.accum_steps)
    return {**self.train_metrics.results(),
            **(self.health.end(values) if self.health else {})}

  # --- State ------------------------------------------------------------------

  def learning_rate(self) -> float:
    """The optimizer's current learning rate (schedules included)."""
    return float(tf.convert_to_tensor(self.optimizer.learning_rate))

  def checkpoint_items(self) -> dict[str, Any]:
    """What a checkpoint holds; a subclass may add its own trackables."""
    # The inner optimizer under loss scaling: its slots are the same in
    # every precision, so checkpoints move between precisions. The dynamic
    # loss scale is not saved; it re-grows within a few hundred steps.
    items = dict(model=self.model, optimizer=self.update.checkpointed(),
                 step=self.step, **self.input.checkpoint_items())
    if self.ema:
      items["ema"] = self.ema.checkpointed()
    if self.random.states:
      items["random"] = self.random.states
    return items


@autograph.plain
def _float32(outputs):
  """The model's outputs (a tensor or a dict of them) as float32: losses
  and metrics run in float32 under any precision policy."""
  return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)

