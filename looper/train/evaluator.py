"""The Evaluator: one exact pass over each eval set, built from an eval step.

Synopsis (what looper.run.pieces.evaluator does with a Trainer)::

    evaluator = Evaluator(trainer.eval_step, strategy=strategy, data=input,
                          sets={"": "test"},
                          fields={"test": "data.eval_split"},
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
run, and checking that each pass held the examples counted.
"""

import contextlib
from typing import Callable

import tensorflow as tf

from looper import autograph
from looper import errors
from looper.data import input as input_lib
from looper.data import splits


class Evaluator:
  """Evaluates through `eval_step` (see module doc).

  Args:
    eval_step: one replica's eval step, `eval_step(batch)`: it feeds `loss`
      and `metrics` (`Trainer.eval_step`).
    strategy: the run's tf.distribute strategy.
    data: the run's Input (looper.data.input): each split's eval pass.
    sets: {set name: split} (looper.data.splits.eval_sets).
    fields: {split: the config field naming it}, for an error's line.
    loss: the eval loss `eval_step` feeds (looper.options.losses.EvalLoss).
    metrics: the eval metrics it feeds (looper.options.metrics.Metrics).
    step: the update counter (the step an evaluation is of).
    average: the weight average eval and export use
      (looper.train.step_options: optimizer.ema_decay); None: the
      weights as trained.
  """

  def __init__(self, eval_step: Callable, *, strategy: tf.distribute.Strategy,
               data: input_lib.Input, sets: dict[str, str],
               fields: dict[str, str], loss, metrics, step: tf.Variable,
               average=None):
    self._eval_step, self._strategy = eval_step, strategy
    self.input = data
    self.sets = sets
    self._fields = fields
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
    field = self._fields[split]
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
