"""The Evaluator: one exact pass per evaluation, on one kept iterator."""

import pytest
import tensorflow as tf

from looper import errors
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
