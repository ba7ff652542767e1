"""The Evaluator: one exact pass over each eval set, built from an eval step.

Synopsis (what looper.run.pieces.evaluator does with a Trainer)::

    evaluator = Evaluator(trainer.eval_step, strategy=strategy, data=input,
                          loss=trainer.eval_loss,
                          metrics=trainer.eval_metrics, step=trainer.step,
                          average=trainer.ema)
    logs = evaluator.evaluate()          # {'loss', metrics..., 'examples'}
    # data.eval_splits={"val": ..., "test": ...}: {'test/loss', ...,
    # 'test/examples', 'val/loss', ..., 'val/examples'} (looper.data.splits)
    with evaluator.averaged_weights():   # the model holds the weight
      ...                                # average inside (optimizer.ema_decay)

One evaluation of one set, all inside one tf.function::

    reset eval loss and metrics
    for i in range(steps):                 # one pass: every example once,
      strategy.run(eval_step, next(iterator))  # the last batch padded,
                                           # its padding masked
    return loss, metrics, examples (the sum of the masks: real examples)

The sets are evaluated one after the other, each with its own pass and its
own counts, through the same function (one trace for sets of one shape).
As the train loop is built from a train step (looper.train.loop), this is
built from an eval step and the state it feeds, and holds no Trainer: the
step is the Trainer's seam (`Trainer.eval_step`, beside `compute_loss`
which it calls), so a subclass changes evaluation where it changes the
loss, and the eval loss and metrics are built with the Trainer's state in
its scope. What is here: running it, on one iterator per set kept for the
run (the Input's eval sets), and checking that each pass held the examples
counted. The `eval` block is declared here (`config()`) and checked here
(`check`).
"""

import contextlib
from typing import Callable

import ml_collections
from ml_collections import config_dict
import tensorflow as tf

from looper import autograph
from looper import errors
from looper import fields
from looper.data import input as input_lib
from looper.data import splits


class Evaluator:
  """Evaluates through `eval_step` (see module doc).

  Args:
    eval_step: one replica's eval step, `eval_step(batch)`: it feeds `loss`
      and `metrics` (`Trainer.eval_step`).
    strategy: the run's tf.distribute strategy.
    data: the run's Input (looper.data.input): its eval sets, each
      split's eval pass and the field naming it (an error's line).
    loss: the eval loss `eval_step` feeds (looper.options.losses.EvalLoss).
    metrics: the eval metrics it feeds (looper.options.metrics.Metrics).
    step: the update counter (the step an evaluation is of).
    average: the weight average eval and export use
      (looper.train.step_options: optimizer.ema_decay); None: the
      weights as trained.
  """

  def __init__(self, eval_step: Callable, *, strategy: tf.distribute.Strategy,
               data: input_lib.Input, loss, metrics, step: tf.Variable,
               average=None):
    self._eval_step, self._strategy = eval_step, strategy
    self.input = data
    self.sets = data.eval_sets  # {set name: split}
    self._loss, self._metrics = loss, metrics
    self._step, self._average = step, average
    # Made on a split's first pass: counting it may take a pass.
    self._plans = {}  # split -> (examples, steps, iterator) of one pass
    self._failed = set()  # splits whose last pass did not end whole: recount
    self._eval_fn = tf.function(self._eval_loop)

  @property
  def metric_names(self) -> list[str]:
    """What `evaluate` reports but the example counts: of each set, the
    loss, each output's loss (a dict of outputs) and each metric."""
    names = ["loss"] + self._loss.output_names + self._metrics.names
    return [splits.metric_name(s, n) for s in self.sets for n in names]

  def averaged_weights(self):
    """A context in which the model holds the moving average of its weights
    (eval, export); no-op without optimizer.ema_decay."""
    average = self._average
    return average.swapped() if average else contextlib.nullcontext()

  def evaluate(self) -> dict[str, float]:
    """Evaluates each eval set whole (or `eval.steps` batches) exactly once.

    Returns:
      'loss', each metric, and 'examples': how many real examples counted;
      with data.eval_splits, those of each set as '<set>/<name>'.
    """
    logs = {}
    with self.averaged_weights():
      for name, split in self.sets.items():
        logs.update({splits.metric_name(name, k): v
                     for k, v in self._evaluate(split).items()})
    return logs

  def _evaluate(self, split: str) -> dict[str, float]:
    """One whole pass over `split`."""
    field = self.input.field(split)
    if split not in self._plans:
      # The size the Input counted (for epochs, describe) is the first
      # plan's; after a pass that went wrong it may be stale: counted anew.
      count, steps, data = self.input.eval_data(
          split, recount=split in self._failed)
      # One iterator over the eval pass repeated, kept: each evaluation
      # takes exactly one pass. A fresh iterator per evaluation ran a third
      # of them at half speed on this CPU (Keras fit's too; BUILD.md).
      self._plans[split] = count, steps, iter(data)
    count, steps, iterator = self._plans.pop(split)
    where = f"of the evaluation at step {int(self._step.numpy())}"
    # Until a whole pass is taken, the next evaluation starts afresh.
    self._failed.add(split)
    try:
      results = self._eval_fn(iterator, tf.constant(steps, tf.int32))
    except tf.errors.InvalidArgumentError as e:
      raise errors.step_error(e, jit_compile=False, field=field,
                              split=split, where=where) from None
    results = {k: float(v) for k, v in results.items()}
    if results["examples"] != count:  # the split changed under the run
      raise errors.DataError(
          f"config.{field}={split!r} gave {results['examples']:.0f}"
          f" examples {where}, where {count} were counted before it: make"
          " config.dataset_fn return the same examples on every pass")
    self._plans[split] = count, steps, iterator
    self._failed.discard(split)
    return results

  def example_spec(self):
    """One example's inputs' spec, of the first eval set: what an export
    serves (looper.workdir.export)."""
    split = next(iter(self.sets.values()))
    return self.input.examples(split).element_spec[0]

  @autograph.plain
  def _eval_loop(self, iterator, steps):
    self._loss.reset()
    self._metrics.reset()
    def one_batch(i):
      self._strategy.run(self._eval_step, args=(next(iterator),))
      return i + 1
    tf.while_loop(lambda i: i < steps, one_batch, (tf.constant(0),))
    return {**self._loss.results(), **self._metrics.results()}


def config() -> ml_collections.ConfigDict:
  """The `eval` block: each field's default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # Evaluate every this many steps, or epochs; both 0: only at the end of
  # training. Set one, the other 0 (IN_EPOCHS).
  c.every_steps = fields.whole(0, low=0)
  c.every_epochs = fields.epochs()
  # GLOBAL batch; the last one is padded and masked.
  c.batch_size = fields.whole(256)
  c.steps = config_dict.placeholder(int)  # None: the whole eval split.
  # --mode=continuous_eval stops after this long without a new checkpoint.
  c.timeout_secs = fields.seconds(3600)
  c.monitor_set = ""  # the eval set callbacks see (looper.data.splits)
  return c


def check(c: ml_collections.ConfigDict) -> None:
  """The `eval` block's own rules (monitor_set names one of data's eval
  sets: looper.config, across blocks); ConfigError on the first."""
  fields.check_declared(c, "eval")
  fields.check(c.steps is None or c.steps >= 1, "eval.steps", c.steps,
               "must be >= 1, or None for the whole eval split")
