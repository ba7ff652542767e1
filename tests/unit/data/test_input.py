"""The Input: the only reader of dataset_fn; the data position it resumes from.

Against references computed here: the examples straight from tiny's
dataset_fn, and the stream of an Input that was never moved.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.configs import configured


def _input(**fields):
  return pieces.input(configured(tiny.get_config(), **fields),
                         tf.distribute.get_strategy())


def _batches(data, n):
  return [next(data.train_iterator())[0].numpy() for _ in range(n)]


@pytest.mark.parametrize("as_arrays", [False, True])
def test_a_seek_resumes_the_stream_where_the_position_says(as_arrays):
  straight = _batches(_input(data__as_arrays=as_arrays), 7)
  moved = _input(data__as_arrays=as_arrays)
  _batches(moved, 3)
  moved.advance(3)
  assert moved.data_position == 3 * 32
  # A new process restoring that position: what a checkpoint gives.
  resumed = _input(data__as_arrays=as_arrays)
  resumed.seek(moved.data_position)
  np.testing.assert_array_equal(np.stack(_batches(resumed, 4)),
                                np.stack(straight[3:]))
  np.testing.assert_array_equal(np.stack(_batches(moved, 4)),
                                np.stack(straight[3:]))
  assert set(resumed.checkpoint_items()) == {"position"}


def test_advance_in_a_tf_function_counts_batches_of_train_batch_size():
  data = _input(train__batch_size=16)
  tf.function(lambda: data.advance(tf.constant(5)))()
  assert data.data_position == 5 * 16


@pytest.mark.parametrize("as_arrays", [False, True])
def test_a_train_split_smaller_than_an_update_is_said(as_arrays):
  """Known without a pass (arrays, tf.data's cardinality): one line."""
  data = _input(train__batch_size=64, data__as_arrays=as_arrays,
                data__train_split="train[:40]")
  assert data.short_split("train[:40]") == (
      "config.data.train_split='train[:40]' holds 40 examples, fewer than"
      " one update's 64 (train.batch_size): every update repeats examples;"
      " lower --config.train.batch_size or widen the split")
  assert data.short_split("train[:64]") == ""


def test_a_split_of_unknown_size_is_not_counted_for_the_warning():
  unknown = lambda c, split: tiny.dataset_fn(c, split).filter(
      lambda x, y: True)  # cardinality unknown: finding it takes a pass
  data = _input(train__batch_size=64, dataset_fn=unknown)
  assert data.short_split("train[:40]") == ""


def test_one_eval_pass_holds_every_example_once_then_repeats():
  data = _input()
  count, steps, dataset = data.eval_data("test")
  x, y = tiny.make_data(1001, seed=1)
  assert (count, steps) == (1001, 16)  # 15 full batches of 64 + 41
  iterator = iter(dataset)
  for _ in range(2):  # the second pass is the first again
    seen, seen_labels, masks = [], [], []
    for _ in range(steps):
      inputs, labels, mask = next(iterator)
      seen.append(inputs.numpy())
      seen_labels.append(labels.numpy())
      masks.append(mask.numpy())
    mask = np.concatenate(masks).astype(bool)
    assert mask.sum() == count and mask.size == steps * 64
    np.testing.assert_array_equal(np.concatenate(seen)[mask], x)
    np.testing.assert_array_equal(np.concatenate(seen_labels)[mask], y)
  spec = data.element_spec
  assert (spec[0].shape.as_list(), spec[1].dtype) == ([tiny.FEATURES],
                                                      tf.int32)
