"""looper.data: one global order on any pipeline count, resume, exact eval;
array mode over virtual windows of a stream."""

import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper.config import ConfigError
from looper.data import arrays
from looper.data import batch as batch_lib
from looper.data import checks
from looper.data import elements
from looper.data import service
from looper.data import sources
from looper.data import windows
from tests.fixtures import tiny
from tests.fixtures.configs import configured

N = 101  # examples; not a multiple of any batch below


def ids(n=N):
  """Examples whose input and label are their own index."""
  r = np.arange(n)
  return tf.data.Dataset.from_tensor_slices(
      (r.astype(np.float32)[:, None], r.astype(np.int32)))


def ctx(pipelines, pipeline_id, replicas):
  return tf.distribute.InputContext(pipelines, pipeline_id, replicas)


def global_batches(pipelines, replicas, steps, global_batch=8, position=0,
                   shuffle=16, examples=ids):
  """The label sets of `steps` global batches, as the strategy assembles them.

  Each pipeline feeds replicas/pipelines replicas with consecutive batches;
  a global batch is the union of every replica's batch of that step.
  """
  per_pipeline = replicas // pipelines
  streams = [
      iter(elements.train_dataset(
          examples(), ctx(pipelines, p, replicas),
          batch_size=global_batch, seed=3, shuffle_buffer=shuffle,
          position=position))
      for p in range(pipelines)]
  out = []
  for _ in range(steps):
    labels = [next(s)[1].numpy() for s in streams for _ in range(per_pipeline)]
    assert all(len(l) == global_batch // replicas for l in labels)
    out.append(sorted(np.concatenate(labels).tolist()))
  return out


@pytest.mark.parametrize("pipelines,replicas", [(1, 2), (1, 8), (2, 2),
                                                (2, 4), (4, 8)])
def test_global_batches_do_not_depend_on_replicas(pipelines, replicas):
  assert global_batches(pipelines, replicas, 30) == global_batches(1, 1, 30)


def test_epochs_are_permutations_and_differ():
  batches = elements.train_dataset(ids(), ctx(1, 0, 1), batch_size=8,
                                seed=3, shuffle_buffer=16, position=0)
  stream = np.concatenate([y for _, y in batches.take(2 * N // 8 + 1)])
  first, second = stream[:N], stream[N:2 * N]
  assert sorted(first) == list(range(N)) == sorted(second)
  assert first.tolist() != second.tolist()  # reshuffled per epoch


@pytest.mark.parametrize("steps_done", [5, 13, 26, 40])  # 13*8 > N: epoch 1+
@pytest.mark.parametrize("pipelines,replicas", [(1, 1), (2, 2), (1, 4)])
def test_resume_from_position_continues_the_stream(steps_done, pipelines,
                                                   replicas):
  whole = global_batches(pipelines, replicas, steps_done + 6)
  resumed = global_batches(pipelines, replicas, 6, position=steps_done * 8)
  assert resumed == whole[steps_done:]


def test_resume_without_known_size_skips_from_the_start():
  unknown = lambda: ids().filter(lambda x, y: True)  # cardinality unknown
  assert int(unknown().cardinality()) == tf.data.UNKNOWN_CARDINALITY
  whole = global_batches(2, 2, 20, examples=unknown)
  assert global_batches(2, 2, 5, position=15 * 8, examples=unknown) == (
      whole[15:])
  assert whole == global_batches(2, 2, 20)


@pytest.mark.parametrize("pipelines,replicas,steps", [
    (1, 4, None), (4, 4, None), (2, 2, None), (1, 1, 3), (2, 4, 3)])
def test_eval_counts_every_example_once(pipelines, replicas, steps):
  global_batch = 16
  count, num_steps = elements.eval_plan(N, global_batch, steps)
  assert num_steps == (7 if steps is None else steps)  # ceil(101 / 16) = 7
  seen, batches = [], 0
  for p in range(pipelines):
    for x, y, mask in elements.eval_dataset(
        ids(), ctx(pipelines, p, replicas), batch_size=global_batch,
        count=count, steps=num_steps):
      assert mask.shape == (global_batch // replicas,)  # static, padded
      seen += y.numpy()[mask.numpy() == 1].tolist()
      batches += 1
  assert batches == num_steps * replicas  # one batch per replica per step
  assert sorted(seen) == list(range(count))
  assert count == (N if steps is None else 3 * global_batch)


def test_unbatched_static_examples_are_required():
  with pytest.raises(ConfigError, match=r"unbatched .*train.batch_size"):
    checks.checked(ids().batch(4), "train")
  with pytest.raises(ConfigError, match=r"\(inputs, label\) pairs"):
    checks.checked(ids().map(lambda x, y: x), "train")
  with pytest.raises(ConfigError, match="returned list"):
    checks.checked([1, 2], "train")
  dataset = ids()
  assert checks.checked(dataset, "train") is dataset


def test_num_examples_counts_or_rejects():
  assert checks.num_examples(ids(), "test") == N
  assert checks.num_examples(ids().filter(lambda x, y: y % 2 == 0), "t") == 51
  with pytest.raises(ConfigError, match=r"endless dataset for split 'test'"):
    checks.num_examples(ids().repeat(), "test")


def test_batch_must_split_evenly_over_replicas():
  batch_lib.Batch(micro_batch_size=64, replicas=8)
  with pytest.raises(ConfigError) as e:
    batch_lib.Batch(micro_batch_size=100, replicas=8)
  assert str(e.value) == (
      "config.train.batch_size=100 is not divisible by the 8 replicas;"
      " set --config.train.batch_size=96")


# --- An empty train split fails in one line instead of spinning forever -----

_EMPTY_TRAIN = ("config.data.train_split='train[:0]' selects no examples:"
                " config.dataset_fn returned an empty dataset; widen"
                " --config.data.train_split or check the data dataset_fn"
                " reads")


def _empty():
  return tf.data.Dataset.from_tensor_slices(
      (np.zeros((0, 8), np.float32), np.zeros((0,), np.int32)))


def _filtered_to_nothing():
  x, y = tiny.make_data(50, seed=0)
  everything = tf.data.Dataset.from_tensor_slices((x, y))
  return everything.filter(lambda x, y: y > 100)  # unknown cardinality


@pytest.mark.parametrize("examples", [_empty, _filtered_to_nothing])
def test_check_nonempty_names_the_split(examples):
  with pytest.raises(lc.ConfigError) as e:
    checks.check_nonempty(examples(), "train[:0]")
  assert str(e.value) == _EMPTY_TRAIN
  with pytest.raises(lc.ConfigError) as e:
    checks.check_nonempty(examples(), "test[5:5]", field="data.eval_split")
  assert str(e.value).startswith(
      "config.data.eval_split='test[5:5]' selects no examples:")


def test_check_nonempty_keeps_a_nonempty_dataset():
  x, y = tiny.make_data(50, seed=0)
  kept = tf.data.Dataset.from_tensor_slices((x, y)).filter(
      lambda x, y: y == 0)  # unknown cardinality, some examples
  assert checks.check_nonempty(kept, "train") is kept


@pytest.mark.parametrize("examples", [_empty, _filtered_to_nothing])
def test_empty_train_stream_raises_instead_of_spinning(examples):
  # Before the fix, iterating this stream never returned: every epoch's
  # flat_map yielded nothing, forever.
  with pytest.raises(lc.ConfigError) as e:
    elements.train_dataset(examples(), tf.distribute.InputContext(),
                       batch_size=8, seed=0, shuffle_buffer=16,
                       position=0, split="train[:0]")
  assert str(e.value) == _EMPTY_TRAIN
  with pytest.raises(lc.ConfigError) as e:  # no split given: still one line
    tf.distribute.get_strategy().distribute_datasets_from_function(
        lambda ctx: sources.Elements(examples, None).train(
            ctx, batch_size=8, seed=0, shuffle_buffer=16, position=0))
  assert str(e.value) == (
      "config.data.train_split selects no examples: config.dataset_fn"
      " returned an empty dataset; widen --config.data.train_split or check"
      " the data dataset_fn reads")


def test_empty_eval_split_is_counted_as_an_error():
  with pytest.raises(lc.ConfigError) as e:
    checks.num_examples(_filtered_to_nothing(), "test[:0]")
  assert str(e.value) == (
      "config.data.eval_split='test[:0]' selects no examples:"
      " config.dataset_fn returned an empty dataset; widen"
      " --config.data.eval_split or check the data dataset_fn reads")


# --- Array mode over windows of a resident stream (looper.data.windows) -----

STREAM = np.random.default_rng(0).integers(0, 256, 260).astype(np.uint8)


def _by_slicing(stream, width, stride, start, count, dtype):
  """Row i = stream[start + i*stride : ... + width], one slice at a time."""
  return np.array([stream[start + i * stride:start + i * stride + width]
                   for i in range(count)], dtype).reshape(count, width)


def _windowed():
  """(inputs, labels, weights) over one stream, as a language model's: the
  labels the inputs shifted by one, weights from a 0/1 stream."""
  inputs = windows.Windows(STREAM, 8, stride=3, count=80, dtype=np.int32)
  labels = windows.Windows(STREAM, 8, stride=3, start=1, count=80,
                           dtype=np.int32)
  real = windows.Windows((STREAM % 3 > 0).astype(np.uint8), 8, stride=3,
                         count=80, dtype=np.float32)
  return inputs, labels, real


def test_windows_are_the_rows_they_stand_for():
  w = windows.Windows(STREAM, 8, stride=3, dtype=np.int32)
  count = (260 - 8) // 3 + 1
  assert (len(w), w.shape, w.ndim, w.dtype) == (count, (count, 8), 2,
                                                np.int32)
  want = _by_slicing(STREAM, 8, 3, 0, count, np.int32)
  np.testing.assert_array_equal(np.asarray(w), want)
  for rows in (slice(5, 40), slice(2, None, 7), slice(None, None, -1),
               slice(60, 10, -4), slice(3, 3)):
    part = w[rows]
    assert isinstance(part, windows.Windows) and part.stream is STREAM
    np.testing.assert_array_equal(np.asarray(part).reshape(-1, 8),
                                  want[rows], err_msg=str(rows))
  assert len(windows.Windows(STREAM, 261)) == 0  # no window fits
  for make, line in [
      (lambda: windows.Windows(STREAM[None], 8),
       "Windows(stream=ndarray of shape (1, 260)): the stream must be a 1-D"
       " numpy array; pass np.frombuffer(data, np.uint8) or a flat array"),
      (lambda: windows.Windows(STREAM, 0),
       "Windows(width=0, stride=1): the width must be >= 1 and the stride"
       " not 0"),
      (lambda: windows.Windows(STREAM, 8, start=253, count=1),
       "Windows(start=253, stride=1, count=1, width=8): a row falls outside"
       " the stream of 260; lower count or start"),
      (lambda: w[3], "Windows[3]: index rows with a slice (w[a:b]), or take"
       " np.asarray(w) first")]:
    with pytest.raises((ValueError, TypeError)) as e:
      make()
    assert str(e.value) == line


def _pipelines(source, pipelines, replicas, steps, position=0):
  """Each pipeline's per-replica train batches, as numpy."""
  return [[tf.nest.map_structure(lambda t: t.numpy(), b) for b in
           source.train(ctx(pipelines, p, replicas), batch_size=8,
                        seed=3, shuffle_buffer=1, position=position)
           .take(steps * replicas // pipelines)] for p in range(pipelines)]


@pytest.mark.parametrize("pipelines,replicas,position", [
    (1, 1, 0), (2, 4, 0), (2, 2, 13 * 8)])
def test_windows_in_array_mode_are_the_rows_of_the_arrays(
    pipelines, replicas, position):
  """Every batch of every pipeline, train (shuffled, 12 steps past an epoch
  of 80), resumed and eval (padded), is the materialized arrays' batch."""
  virtual = arrays.Arrays(_windowed(), "train")
  dense = arrays.Arrays(tuple(map(np.asarray, _windowed())), "train")
  assert virtual.size == dense.size == 80
  assert arrays.is_arrays(_windowed())
  got = _pipelines(virtual, pipelines, replicas, 12, position)
  want = _pipelines(dense, pipelines, replicas, 12, position)
  for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    assert g.dtype == w.dtype
    np.testing.assert_array_equal(g, w)
  for p in range(pipelines):
    evals = [source.eval(ctx(pipelines, p, replicas), batch_size=16,
                         count=80, steps=6) for source in (virtual, dense)]
    for g, w in zip(*evals):  # 96 slots: 16 of padding, mask 0
      tf.nest.map_structure(np.testing.assert_array_equal, g, w)


def test_windows_examples_spec_checks_and_one_stream_tensor():
  source = arrays.Arrays(_windowed(), "train")
  examples = checks.checked(source.examples(), "train")
  assert [(s.shape, s.dtype) for s in examples.element_spec] == [
      ((8,), tf.int32), ((8,), tf.int32), ((8,), tf.float32)]
  assert int(examples.cardinality()) == 80
  for got, want in zip(examples.batch(80).get_single_element(),
                       map(np.asarray, _windowed())):
    np.testing.assert_array_equal(got, want)
  # Inputs and labels share one tensor of the stream (the weights have
  # their own stream): converted once, not once per leaf.
  # pylint: disable-next=protected-access
  inputs, labels, weights = source._tensors()
  assert inputs.args[0] is labels.args[0]
  assert inputs.args[0].shape == (260,) and inputs.args[0].dtype == tf.uint8
  assert weights.args[0] is not inputs.args[0]


def test_windows_are_refused_by_the_data_service_as_arrays():
  config = configured(tiny.get_config(), {"data.service": "localhost:5050"})
  with pytest.raises(ConfigError) as e:
    service.check_source(arrays.Arrays(_windowed(), "train"), config.data)
  assert str(e.value) == (
      "config.data.service='localhost:5050': split 'train' comes as numpy"
      " arrays, which would be copied into the graph every service worker"
      " gets; write the split as shards (python -m looper.cli.shards write"
      " --config=... --out=DIR) and set --config.data.shards_dir=DIR, or set"
      " --config.data.service=''")
