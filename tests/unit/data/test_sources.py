"""Array mode and file mode: exact on any topology, resumable, each pipeline
reading only its own share; the shard writer's bit-exact round trip."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper.cli import shards as shards_cli
from looper.data import arrays
from looper.data import shards
from looper.data import sources
from tests.fixtures import catalogue
from tests.fixtures import tiny

N, B = 1001, 32  # N: a prime-ish size, never a multiple of the batch


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
  """16 shards of examples whose label is their index (0..N-1)."""
  x, _ = tiny.make_data(N, seed=0)
  directory = str(tmp_path_factory.mktemp("shards") / "train")
  shards.write(tf.data.Dataset.from_tensor_slices(
      (x, np.arange(N, dtype=np.int32))), directory, min_shards=16)
  return directory


def _files(directory, v=8):
  source = shards.read(directory, "train")
  source.virtual_shards = v
  return source


def _arrays():
  x, _ = tiny.make_data(N, seed=0)
  return arrays.Arrays((x, np.arange(N, dtype=np.int32)), "train")


def global_batches(source, replicas, pipelines, steps, position=0, seed=3):
  """The labels of global batches, assembled from every pipeline's stream."""
  local = replicas // pipelines
  streams = []
  for p in range(pipelines):
    ctx = tf.distribute.InputContext(pipelines, p, replicas)
    batches = source.train(ctx, batch_size=B, seed=seed,
                           shuffle_buffer=64, position=position)
    streams.append([y for _, y in batches.take(steps * local)
                    .as_numpy_iterator()])
  return [np.concatenate([streams[p][k * local + l] for p in range(pipelines)
                          for l in range(local)]) for k in range(steps)]


@pytest.mark.parametrize("make", [_arrays, "files", "cached files"])
@pytest.mark.slow  # over 2 s: out of the fast lane
def test_global_batches_do_not_depend_on_the_topology(make, shard_dir):
  source = make() if callable(make) else _files(shard_dir)
  source.cache = make == "cached files"
  one = global_batches(source, 1, 1, steps=70)  # 70*32 > 2 epochs
  for replicas, pipelines in [(2, 1), (4, 2), (8, 8)]:
    other = global_batches(source, replicas, pipelines, steps=70)
    np.testing.assert_array_equal(np.stack(other), np.stack(one),
                                  err_msg=f"{replicas} replicas")
  # Resume at step 40 on another topology: the same batches follow.
  resumed = global_batches(source, 2, 2, steps=30, position=40 * B)
  np.testing.assert_array_equal(np.stack(resumed), np.stack(one[40:]))
  # A real shuffle: each epoch is a permutation, and epochs differ.
  stream = np.concatenate(one)
  epoch0, epoch1 = stream[:N], stream[N:2 * N]
  if make != _arrays:  # groups run epochs on their own: check coverage
    assert set(stream[:62 * B]) == set(range(N))
  else:
    assert sorted(epoch0) == list(range(N)) == sorted(epoch1)
    assert not np.array_equal(epoch0, epoch1)
  assert not np.array_equal(stream[:N], np.arange(N))


def test_each_pipeline_reads_only_its_own_files(shard_dir):
  source = _files(shard_dir)
  index = json.load(open(f"{shard_dir}/{shards.INDEX}"))
  bounds = np.cumsum([0] + [count for _, count in index["files"]])
  file_of = lambda label: int(np.searchsorted(bounds, label, side="right") - 1)
  seen = []
  for p in range(4):  # 4 pipelines of 2 replicas: 8 groups, 2 files each
    ctx = tf.distribute.InputContext(4, p, 8)
    labels = np.concatenate([y for _, y in source.train(
        ctx, batch_size=B, seed=0, shuffle_buffer=64,
        position=0).take(200).as_numpy_iterator()])
    seen.append({file_of(label) for label in labels})
  groups = source.groups()
  for p in range(4):
    assert seen[p] == set(groups[2 * p] + groups[2 * p + 1]), p
  assert sorted(f for s in seen for f in s) == list(range(16))


def test_write_read_round_trip_is_bit_exact(tmp_path):
  rng = np.random.default_rng(0)
  inputs = {"image": rng.integers(0, 255, (37, 4, 3), np.uint8),
            "weights": rng.normal(size=(37, 5)).astype(np.float64),
            "half": rng.normal(size=(37, 2)).astype(np.float16),
            "text": np.array([f"ex{i}".encode() for i in range(37)])}
  labels = np.arange(37, dtype=np.int64) - 5
  written = tf.data.Dataset.from_tensor_slices((inputs, labels))
  index = shards.write(written, str(tmp_path / "s"), min_shards=4)
  assert [c for _, c in index["files"]] == [9, 9, 9, 10]
  back = shards.read(str(tmp_path / "s"))
  assert back.examples().element_spec == written.element_spec
  for (a, y), (b, z) in zip(written.as_numpy_iterator(),
                            back.examples().as_numpy_iterator(), strict=True):
    assert y == z
    for key in a:
      assert np.asarray(a[key]).tobytes() == np.asarray(b[key]).tobytes(), key
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "shards-already-written", dir=tmp_path / "s")):
    shards.write(written, str(tmp_path / "s"))
  with pytest.raises(lc.ConfigError,
                     match=catalogue.line("no-complete-shards")):
    shards.read(str(tmp_path))


def test_user_files_are_counted_once_into_an_index(tmp_path):
  for i, n in enumerate([3, 5]):
    with tf.io.TFRecordWriter(str(tmp_path / f"f{i}.tfrecord")) as w:
      for j in range(n):
        w.write(tf.io.serialize_tensor(tf.constant(j)).numpy())
  parse = lambda r: (tf.ensure_shape(tf.io.parse_tensor(r, tf.int32), []),
                     tf.constant(0))
  files = shards.Files(str(tmp_path / "*.tfrecord"), parse=parse)
  assert files.counts == [3, 5]
  index = json.load(open(tmp_path / shards.INDEX))
  assert index["files"] == [["f0.tfrecord", 3], ["f1.tfrecord", 5]]
  # Next time the counts come from the index, not from reading the files.
  index["files"] = [["f0.tfrecord", 30], ["f1.tfrecord", 50]]
  json.dump(index, open(tmp_path / shards.INDEX, "w"))
  assert shards.Files(str(tmp_path / "*.tfrecord"), parse=parse).counts == [
      30, 50]


@pytest.mark.parametrize("v, replicas, batch, message", [
    (32, 1, 32, catalogue.line("virtual-shards-beyond-files")),
    (16, 1, 40, catalogue.line("virtual-shards-not-dividing-batch")),
    (10, 4, 40, catalogue.line("virtual-shards-not-per-replica")),
], ids=["beyond-files", "not-dividing-batch", "not-per-replica"])
def test_file_mode_constraints_are_one_line(shard_dir, v, replicas, batch,
                                            message):
  with pytest.raises(lc.ConfigError, match=message):
    _files(shard_dir, v).check(replicas, batch, "train.batch_size")


def test_what_dataset_fn_returns_selects_the_mode(shard_dir):
  options = lc.default_config().data
  x, y = tiny.make_data(10, seed=0)
  make = lambda value: sources.make("train", "data.train_split", options,
                                    lambda: value)
  assert isinstance(make((x, y)), arrays.Arrays)
  assert isinstance(make(tf.data.Dataset.from_tensor_slices((x, y))),
                    sources.Elements)
  assert isinstance(make(shards.read(shard_dir)), shards.Files)
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "dataset-fn-returned-something-else")):
    make([x, y])
  with pytest.raises(lc.ConfigError,
                     match=catalogue.line("arrays-of-different-lengths")):
    make((x, y[:5]))
  with pytest.raises(lc.ConfigError, match="selects no examples"):
    make((x[:0], y[:0]))


@pytest.mark.slow  # a subprocess
def test_the_writer_command_writes_both_splits(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run(
      [sys.executable, "-m", "looper.cli.shards", "write",
       "--config=tests/fixtures/tiny.py",
       f"--out={out}", "--min_shards=8", "--config.model.num_examples=100"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"{out}/train: 100 examples in 8 shards" in proc.stdout
  x, y = tiny.make_data(100, seed=1)  # tiny's test split
  test = list(shards.read(str(out / "test")).examples().as_numpy_iterator())
  np.testing.assert_array_equal(np.stack([a for a, _ in test]), x)
  np.testing.assert_array_equal([b for _, b in test], y)


def test_the_writer_writes_the_splits_it_is_given(tmp_path):
  c = tiny.get_config()
  c.model.num_examples = 100
  lines = list(shards_cli.write(c, str(tmp_path), ["test[:40]"],
                                min_shards=4))
  assert lines == [f"{tmp_path}/test[:40]: 40 examples in 4 shards"]
  x, y = tiny.make_data(100, seed=1)
  back = list(shards.read(str(tmp_path / "test[:40]")).examples()
              .as_numpy_iterator())
  np.testing.assert_array_equal(np.stack([a for a, _ in back]), x[:40])
  np.testing.assert_array_equal([b for _, b in back], y[:40])


def test_shards_dir_never_calls_dataset_fn(shard_dir):
  """Its loader may download: with shards_dir set it must not run."""
  options = lc.default_config().data
  options.shards_dir, options.virtual_shards = shard_dir.rsplit("/", 1)[0], 8

  def dataset_fn():
    raise AssertionError("dataset_fn called")
  source = sources.make("train", "data.train_split", options, dataset_fn)
  assert isinstance(source, shards.Files) and source.size == N
  assert source.virtual_shards == 8
