"""The step's pieces of a run, from its config: built, checked, restored.

Synopsis (what `looper.run.Run` does; a notebook or a test builds one alone)::

    from looper.run import pieces
    trainer = pieces.trainer(config, strategy, data, batch,
                             steps_per_loop=100)
    evaluator = pieces.evaluator(trainer, data)
    pieces.check(config, trainer, data, evaluator,
                 modes.MODES["train_and_eval"])  # before a file is written
    pieces.restore(config, trainer, checkpointer)  # or the warm start
    trainer.train(100); evaluator.evaluate()

The Trainer is the step math and reads only its own blocks
(looper.train.trainer); what surrounds its step, each option from its own
block, is assembled here and handed in: the precision, XLA, dense
gradients, the class weights, the clipping, the sharded optimizer state and
the weight average (`StepOptions`), the stop request, the schedule's
length, whether a Keras callback may set the rate, the timed input wait.
The Evaluator is built from the Trainer's eval step and the state it
feeds (looper.train.evaluator), as the train loop from its train step.
Before anything is written they are checked on the data (the model and
the loss on each split's first examples: looper.measure.dry_run); a run
resumes from the workdir's last checkpoint, or starts from the one
config.init names.
"""

from absl import logging
import keras
import ml_collections
import tensorflow as tf

from looper import errors
from looper import modes
from looper import references
from looper.data import batch as batch_lib
from looper.data import input as input_lib
from looper.measure import dry_run
from looper.options import best
from looper.options import cluster
from looper.train import evaluator as evaluator_lib
from looper.train import stopping
from looper.train import trainer as trainer_lib
from looper.train.step_options import StepOptions
from looper.workdir import checkpoint
from looper.workdir import contents


def trainer(config: ml_collections.ConfigDict,
            strategy: tf.distribute.Strategy, data: input_lib.Input,
            batch: batch_lib.Batch, *, steps_per_loop: int,
            stop: stopping.StopFlag | None = None,
            cls: type | None = None) -> trainer_lib.Trainer:
  """`config.trainer` (or `cls`) on `data`, its options from their blocks.

  Args:
    config: the run's config, epochs resolved (looper.control.epochs).
    strategy, data, batch: the run's strategy, Input and Batch.
    steps_per_loop: the longest train call (train.steps_per_loop).
    stop: the run's stop request (default: the Trainer's own).
    cls: the Trainer class (default: config.trainer's).

  Raises:
    ConfigError: train.steps is 0 (train.epochs not resolved yet).
  """
  cls = cls or references.resolve(config.trainer, "trainer")
  t, opt = config.train, config.optimizer
  if not t.steps:  # the schedule's length
    raise errors.ConfigError(
        f"config.train.steps=0 reached the Trainer with train.epochs="
        f"{t.epochs}; build it from the config"
        " looper.config.resolve_epochs(config, input)[0] returns (as looper.run"
        " does), or set config.train.steps")
  # Same seed, same initial weights: whatever the replica count.
  keras.utils.set_random_seed(config.seed)
  return cls(
      config, strategy, data, batch, steps_per_loop=steps_per_loop,
      total_steps=t.steps, stop=stop,
      options=StepOptions(
          precision=t.precision, jit_compile=t.jit_compile,
          dense_gradients=bool(config.data.bucket),
          class_weights=config.data.class_weights,
          clip_norm=opt.clip_global_norm,
          shard=config.distribution.shard_optimizer, ema_decay=opt.ema_decay,
          health=t.health_metrics, grad_norm=t.grad_norm),
      timed=not t.deterministic, settable_rate=bool(config.callbacks))


def evaluator(trainer: trainer_lib.Trainer,  # pylint: disable=redefined-outer-name
              data: input_lib.Input) -> evaluator_lib.Evaluator:
  """One exact pass over each of `data`'s eval sets, built from
  `trainer`'s eval step and the eval state it feeds."""
  return evaluator_lib.Evaluator(
      trainer.eval_step, strategy=trainer.strategy, data=data,
      loss=trainer.eval_loss, metrics=trainer.eval_metrics,
      step=trainer.step, average=trainer.ema)


def check(config: ml_collections.ConfigDict, trainer: trainer_lib.Trainer,  # pylint: disable=redefined-outer-name
          data: input_lib.Input, evaluator: evaluator_lib.Evaluator,  # pylint: disable=redefined-outer-name
          mode: modes.Mode) -> None:
  """Everything that can be checked, checked before a file is written:
  nothing already saved in a workdir is touched by a bad config, and a bad
  eval split fails now, not after hours of training. `mode`: which splits
  are read (looper.modes)."""
  c, train_split = config, config.data.train_split
  dry_run.check_inputs(trainer, data, mode.reads(train_split, evaluator.sets),
                       loss=c.loss, metrics=c.metrics, data=c.data)
  best.check_best_metric(c.checkpoint.best_metric, evaluator.metric_names)
  cores = cluster.tpu_cores(trainer.strategy, c.distribution)
  for warning in (mode.trains and data.short_split(train_split),
                  mode.trains and cores and cluster.tpu_batch_warning(
                      data.batch.micro_batch_size, cores)):
    if warning:
      logging.warning("%s", warning)


def restore(config: ml_collections.ConfigDict, trainer: trainer_lib.Trainer,  # pylint: disable=redefined-outer-name
            checkpointer: checkpoint.Checkpointer) -> str | None:
  """The workdir's latest checkpoint, restored (its path), or else the
  warm start config.init names (the schedule starts over); None."""
  restored = checkpointer.restore()
  init = config.init
  if not restored and init.checkpoint:
    items = {"model": trainer.model}
    if init.optimizer:  # as a checkpoint holds it (whole if sharded)
      items["optimizer"] = trainer.checkpoint_items()["optimizer"]
    contents.warm_start(init.checkpoint, items)
    trainer.optimizer.iterations.assign(0)
  return restored
