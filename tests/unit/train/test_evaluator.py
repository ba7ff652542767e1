"""The Evaluator: one exact pass per evaluation, on one kept iterator."""

import numpy as np
import pytest
import tensorflow as tf

from looper import errors
from looper.data import batch as batch_lib
from looper.options import losses
from looper.options import metrics
from looper.train import evaluator as evaluator_lib
from tests.fixtures import pieces
from tests.fixtures import tiny


def test_each_evaluation_takes_one_whole_pass_and_a_shrunk_split_is_named():
  """Evaluations share one iterator over the eval pass repeated (a fresh
  iterator per evaluation ran a third of them at half speed): each takes
  exactly one pass, and a split that shrinks under the run is one line."""
  real = tf.Variable(1001, dtype=tf.int64)  # eval examples dataset_fn gives

  def dataset_fn(config, split):
    data = tiny.dataset_fn(config, split)
    if split == config.data.train_split:
      return data
    return data.enumerate().filter(lambda i, _: i < real).map(
        lambda _, example: example)

  c = tiny.get_config()
  c.dataset_fn = dataset_fn
  trainer = pieces.trainer(c, tf.distribute.get_strategy())
  evaluator = pieces.evaluator(trainer)
  first = evaluator.evaluate()
  assert first["examples"] == 1001
  assert [evaluator.evaluate() for _ in range(3)] == [first] * 3
  trainer.train(5)
  moved = evaluator.evaluate()  # new weights, the same whole pass
  assert moved["examples"] == 1001 and moved["loss"] != first["loss"]
  real.assign(990)
  with pytest.raises(errors.DataError) as e:
    for _ in range(2):  # the pass under way may hold 1001: the next cannot
      evaluator.evaluate()
  # 990 real + 23 padding = 15 whole batches of 64; the 16th is the next
  # pass's first.
  assert str(e.value) == (
      "config.data.eval_split='test' gave 1024 examples of the evaluation at"
      " step 5, where 1001 were counted before it: make config.dataset_fn"
      " return the same examples on every pass")
  assert evaluator.evaluate()["examples"] == 990  # counted afresh


def test_an_evaluator_is_built_from_an_eval_step_and_its_state_alone():
  """No Trainer: an eval step of one's own (here a fixed linear model's
  squared error of the label's logit) and the loss and metric it feeds
  give one exact pass over the split, padding masked; NumPy's figures
  over its 1001 examples."""
  c = tiny.get_config()
  data = pieces.input(c)
  kernel = np.random.default_rng(5).normal(
      size=(tiny.FEATURES, tiny.NUM_CLASSES)).astype(np.float32)
  with data.strategy.scope():
    loss = losses.EvalLoss("mean_squared_error", "batch_size")
    accuracy = metrics.Metrics(("accuracy",))
    step = tf.Variable(7, dtype=tf.int64)

  def eval_step(batch):
    *example, mask = batch
    inputs, labels, _ = batch_lib.parts(example)
    logits = tf.matmul(inputs, kernel)
    picked = tf.gather(logits, labels, batch_dims=1)
    loss.update(tf.square(picked), None, mask)
    accuracy.update(labels, logits, mask)

  evaluator = evaluator_lib.Evaluator(
      eval_step, strategy=data.strategy, data=data, loss=loss,
      metrics=accuracy, step=step)
  logs = evaluator.evaluate()
  x, y = tiny.make_data(1001, seed=1)
  logits = x.astype(np.float64) @ kernel
  assert evaluator.metric_names == ["loss", "accuracy"]
  assert logs["examples"] == 1001
  np.testing.assert_allclose(
      [logs["loss"], logs["accuracy"]],
      [np.mean(logits[np.arange(1001), y] ** 2),
       np.mean(logits.argmax(axis=1) == y)], rtol=1e-5)
