"""The Evaluator: one exact pass over the eval split, on the trainer's state.

Synopsis::

    evaluator = Evaluator(trainer)       # the trainer's Input by default
    logs = evaluator.evaluate()          # {'loss', metrics..., 'examples'}
    with evaluator.averaged_weights():   # the model holds the weight
      ...                                # average inside (optimizer.ema_decay)

One evaluation, all inside one tf.function::

    reset eval loss and metrics
    for i in range(steps):                 # one pass: every example once,
      strategy.run(trainer.eval_step, next(iterator))  # the last batch
                                           # padded, its padding masked
    return loss, metrics, examples (the sum of the masks: real examples)

The step is the Trainer's seam (`Trainer.eval_step`, beside `compute_loss`
which it calls), so a subclass changes evaluation where it changes the
loss; the eval state (`eval_loss`, `eval_metrics`) is built with the
Trainer's in its scope. What is here: running it, on one iterator kept for
the run, and checking that each pass held the examples counted.
"""

import contextlib

import tensorflow as tf

from looper import autograph
from looper import errors
from looper.data import input as input_lib


class Evaluator:
  """Evaluates a `looper.train.trainer.Trainer`'s model (see module doc)."""

  def __init__(self, trainer, input: input_lib.Input | None = None):  # pylint: disable=redefined-builtin
    self.trainer = trainer
    self.input = input or trainer.input
    # Made on the first evaluate(): counting the split may take a pass.
    self._plan = None  # (examples, steps, iterator) of one eval pass
    self._failed = False  # the last pass did not end whole: recount
    self._eval_fn = tf.function(self._eval_loop)

  @property
  def metric_names(self) -> list[str]:
    """What `evaluate` reports besides 'loss' and 'examples': each output's
    loss (a dict of outputs) and each metric, by log name."""
    return (self.trainer.eval_loss.output_names +
            self.trainer.eval_metrics.names)

  def averaged_weights(self):
    """A context in which the model holds the moving average of its weights
    (eval, export); no-op without optimizer.ema_decay."""
    ema = self.trainer.ema
    return ema.swapped() if ema else contextlib.nullcontext()

  def evaluate(self) -> dict[str, float]:
    """Evaluates the whole eval split (or `eval.steps` batches) exactly once.

    Returns:
      'loss', each metric, and 'examples': how many real examples counted.
    """
    split = self.input.config.data.eval_split
    if self._plan is None:
      # The size the Input counted (for epochs, describe) is the first
      # plan's; after a pass that went wrong it may be stale: counted anew.
      count, steps, data = self.input.eval_data(recount=self._failed)
      # One iterator over the eval pass repeated, kept: each evaluation
      # takes exactly one pass. A fresh iterator per evaluation ran a third
      # of them at half speed on this CPU (Keras fit's too; BUILD.md).
      self._plan = count, steps, iter(data)
    count, steps, iterator = self._plan
    where = f"of the evaluation at step {self.trainer.global_step}"
    # Until a whole pass is taken, the next evaluation starts afresh.
    self._plan, self._failed = None, True
    with self.averaged_weights():
      try:
        results = self._eval_fn(iterator, tf.constant(steps, tf.int32))
      except tf.errors.InvalidArgumentError as e:
        raise errors.step_error(e, jit_compile=False, field="data.eval_split",
                                split=split, where=where) from None
      results = {k: float(v) for k, v in results.items()}
    if results["examples"] != count:  # the split changed under the run
      raise errors.DataError(
          f"config.data.eval_split={split!r} gave {results['examples']:.0f}"
          f" examples {where}, where {count} were counted before it: make"
          " config.dataset_fn return the same examples on every pass")
    self._plan, self._failed = (count, steps, iterator), False
    return results

  @autograph.plain
  def _eval_loop(self, iterator, steps):
    trainer = self.trainer
    trainer.eval_loss.reset()
    trainer.eval_metrics.reset()
    def one_batch(i):
      trainer.strategy.run(trainer.eval_step, args=(next(iterator),))
      return i + 1
    tf.while_loop(lambda i: i < steps, one_batch, (tf.constant(0),))
    return {**trainer.eval_loss.results(), **trainer.eval_metrics.results()}
