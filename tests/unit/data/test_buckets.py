"""looper.data with config.data.bucket: variable-length examples padded to a
few lengths, still one global order on any topology, resumable, exact eval.

Run::

    cd /work/main && PYTHONPATH=. python -m pytest -q tests/unit/data/test_buckets.py

Example i is i+1 repeated LENGTHS[i] times (0 to 39 tokens, so some are
empty) with label i: any batch can be checked against the examples by hand.
"""

import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper.data import buckets
from looper.data import checks
from looper.data import elements
from looper.data import sources
from tests.fixtures import catalogue

N, BUCKET, B = 203, 10, 8
LENGTHS = np.random.default_rng(0).integers(0, 40, N)
# Each example's bucket: lengths 0-10 -> 1, 11-20 -> 2, ...; padded to 10 * it.
BUCKETS = np.maximum(-(-LENGTHS // BUCKET), 1)
COUNTS = np.bincount(BUCKETS)
PER_EPOCH = int(sum(COUNTS // B))  # global batches per epoch


def examples(lengths=LENGTHS):
  rows = [np.full(n, i + 1, np.int32) for i, n in enumerate(lengths)]
  ragged = tf.RaggedTensor.from_row_lengths(np.concatenate(rows), lengths)
  return tf.data.Dataset.from_tensor_slices(
      (ragged, np.arange(len(lengths), dtype=np.int32))).map(
          lambda x, y: (x, y))


def ctx(pipelines, pipeline_id, replicas):
  return tf.distribute.InputContext(pipelines, pipeline_id, replicas)


def global_batches(pipelines, replicas, steps, position=0):
  """`steps` global (tokens, labels) batches, assembled as the strategy
  does: the replicas' batches of a step, pipeline by pipeline."""
  local = replicas // pipelines
  streams = [list(buckets.train_dataset(
      examples(), ctx(pipelines, p, replicas), batch_size=B, seed=3,
      shuffle_buffer=64, position=position, bucket=BUCKET)
                  .take(steps * local).as_numpy_iterator())
             for p in range(pipelines)]
  parts = lambda k: [streams[p][k * local + l] for p in range(pipelines)
                     for l in range(local)]
  for k in range(steps):
    # All replicas of a step run at one length.
    assert len({x.shape for x, _ in parts(k)}) == 1
  return [(np.concatenate([x for x, _ in parts(k)]),
           np.concatenate([y for _, y in parts(k)])) for k in range(steps)]


def assert_rows_are_the_examples(tokens, labels):
  """Row j is example labels[j]'s tokens, then zeros."""
  for row, i in zip(tokens, labels):
    np.testing.assert_array_equal(row[:LENGTHS[i]], i + 1)
    assert not row[LENGTHS[i]:].any()


@pytest.fixture(scope="module")
def one_replica():
  """Three epochs and a bit on one replica: the reference stream."""
  return global_batches(1, 1, 3 * PER_EPOCH + 4)


def test_each_global_batch_is_one_bucket_padded_to_it(one_replica):
  assert COUNTS[1:].min() >= B and len(COUNTS) == 5  # buckets 1-4 all fill
  for tokens, labels in one_replica:
    bucket, = set(BUCKETS[labels])
    assert tokens.shape == (B, bucket * BUCKET)
    assert_rows_are_the_examples(tokens, labels)
  assert {x.shape[1] for x, _ in one_replica} == {10, 20, 30, 40}


def test_every_epoch_drops_only_each_buckets_last_partial_batch(one_replica):
  epochs = [one_replica[e * PER_EPOCH:(e + 1) * PER_EPOCH] for e in range(3)]
  orders = []
  for epoch in epochs:
    labels = np.concatenate([y for _, y in epoch])
    assert len(set(labels)) == len(labels)  # no example twice
    # Bucket b gives COUNTS[b] // B batches, so the next epoch starts
    # exactly where a restart computes it does.
    np.testing.assert_array_equal(
        np.bincount([BUCKETS[y[0]] for _, y in epoch], minlength=5),
        COUNTS // B)
    orders.append(labels)
  # Reshuffled per epoch: other examples, in another order.
  assert not np.array_equal(orders[0], orders[1])
  assert set(orders[0]) != set(orders[1])


@pytest.mark.parametrize("pipelines,replicas", [(1, 2), (2, 4), (4, 4)])
def test_global_batches_do_not_depend_on_the_topology(one_replica, pipelines,
                                                      replicas):
  steps = PER_EPOCH + 4  # into the second epoch
  other = global_batches(pipelines, replicas, steps)
  for (x, y), (ox, oy) in zip(one_replica[:steps], other, strict=True):
    np.testing.assert_array_equal(oy, y)
    np.testing.assert_array_equal(ox, x)  # the same length, too


# Within epoch 0, then jumps to epochs 1 and 2 and skips within them.
@pytest.mark.parametrize("steps_done", [5, PER_EPOCH + 3, 2 * PER_EPOCH + 1])
def test_resume_from_position_continues_the_stream(one_replica, steps_done):
  resumed = global_batches(2, 2, 3, position=steps_done * B)
  for (x, y), (rx, ry) in zip(one_replica[steps_done:], resumed):
    np.testing.assert_array_equal(ry, y)
    np.testing.assert_array_equal(rx, x)


@pytest.mark.parametrize("pipelines,replicas,steps", [(1, 1, None),
                                                      (2, 4, None),
                                                      (2, 2, 3)])
def test_eval_counts_every_example_once(pipelines, replicas, steps):
  global_batch = 16
  count, num_steps = elements.eval_plan(N, global_batch, steps)
  local = replicas // pipelines
  streams = [list(buckets.eval_dataset(
      examples(), ctx(pipelines, p, replicas), batch_size=global_batch,
      count=count, steps=num_steps, bucket=BUCKET).as_numpy_iterator())
             for p in range(pipelines)]
  assert all(len(s) == num_steps * local for s in streams)
  seen = []
  for k in range(num_steps):
    parts = [streams[p][k * local + l] for p in range(pipelines)
             for l in range(local)]
    tokens, labels, mask = (np.concatenate(t) for t in zip(*parts))
    real = labels[mask == 1]
    # In the split's order; the global batch at its longest example,
    # rounded up to the bucket.
    np.testing.assert_array_equal(
        real, np.arange(k * global_batch, k * global_batch + len(real)))
    assert tokens.shape == (global_batch,
                            BUCKETS[real].max() * BUCKET)
    assert_rows_are_the_examples(tokens[mask == 1], real)
    assert not tokens[mask == 0].any()
    seen += real.tolist()
  assert seen == list(range(count))
  assert count == (N if steps is None else 3 * global_batch)


def test_eval_batch_of_empty_examples_gets_the_first_bucket():
  lengths = np.array([0] * 16 + [3] * 4)
  tokens, _, mask = next(buckets.eval_dataset(
      examples(lengths), ctx(1, 0, 1), batch_size=16, count=20,
      steps=2, bucket=BUCKET).as_numpy_iterator())
  assert tokens.shape == (16, BUCKET) and mask.all() and not tokens.any()


def test_bucket_takes_a_dataset_only():
  options = lc.default_config().data
  options.bucket = 16
  arrays = (np.zeros((10, 4), np.float32), np.zeros(10, np.int32))
  with pytest.raises(lc.ConfigError,
                     match=catalogue.line("bucket-without-a-dataset")):
    sources.make("train", "data.train_split", options, lambda: arrays)


def test_no_bucket_holding_a_whole_batch_is_one_line():
  with pytest.raises(lc.ConfigError,
                     match=catalogue.line("bucket-holds-no-batch")):
    buckets.train_dataset(examples(), ctx(1, 0, 1), batch_size=64,
                       seed=0, shuffle_buffer=0, position=0, split="train",
                       bucket=BUCKET)


def test_variable_inputs_need_bucket_and_plain_tensors():
  with pytest.raises(lc.ConfigError, match=r"shape \(None,\) .*"
                     r"--config\.data\.bucket to pad"):
    checks.checked(examples(), "train")
  dataset = examples()
  assert checks.checked(dataset, "train", variable=True) is dataset
  ragged = tf.RaggedTensor.from_row_lengths([1, 2, 3], [1, 2])
  rows = tf.data.Dataset.from_tensor_slices((ragged, [0, 1]))
  with pytest.raises(lc.ConfigError, match=r"type RaggedTensorSpec .*"
                     r"\.map\(lambda x, y: \(x, y\)\)"):
    checks.checked(rows, "train", variable=True)
  unknown_label = examples().map(lambda x, y: (x, x))
  with pytest.raises(lc.ConfigError, match=r"shape \(None,\)"):
    checks.checked(unknown_label, "train", variable=True)
