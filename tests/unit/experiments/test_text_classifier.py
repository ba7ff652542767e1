"""Tests of experiments/text_classifier.py: the shapes looper's train
pipeline feeds it under data.bucket, the padding mask, the config checks,
and training end to end on one and two replicas.

Run::

    cd /work/main && PYTHONPATH=. python -m pytest -q \
        tests/unit/experiments/test_text_classifier.py

The data is generated here in Keras' imdb.npz format: reviews of 3-89 word
ranks (4-90 tokens with the start id, cut to max_len=64, so all four
buckets of 16 occur); positive iff they hold ranks 11-15. The pipeline
itself (order, resume, topologies) is tested in tests/unit/data/test_buckets.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from experiments import text_classifier as tc
from looper import config as lc
from looper import run
from looper.options import distribute
from tests.fixtures import pieces
from tests.fixtures.configs import configured, run_here
from tests.fixtures.events import curve, scalars

POSITIVE, NEGATIVE = (11, 12, 13, 14, 15), (16, 17, 18, 19, 20)
NUM_TRAIN, NUM_TEST, BATCH, MAX_LEN, BUCKET = 1000, 300, 32, 64, 16


def reviews(num: int, seed: int):
  """`num` reviews of 3-89 word ranks in 21..399, two sentiment words each
  among the first 60 (so they survive keeping the first 64 tokens)."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, num)
  xs = np.empty(num, dtype=object)  # ragged: a list per review, as Keras'
  for i in range(num):
    length = int(rng.integers(3, 90))
    words = rng.integers(21, 400, length).tolist()
    cues = POSITIVE if labels[i] else NEGATIVE
    for p in rng.choice(min(length, 60), 2, replace=False):
      words[p] = int(rng.choice(cues))
    xs[i] = words
  return xs, labels


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """(folder with imdb.npz, each train review's tokens after the cut)."""
  directory = tmp_path_factory.mktemp("imdb_text")
  x_train, y_train = reviews(NUM_TRAIN, seed=0)
  x_test, y_test = reviews(NUM_TEST, seed=1)
  np.savez(directory / "imdb.npz", x_train=x_train, y_train=y_train,
           x_test=x_test, y_test=y_test)
  return directory, np.minimum([len(x) + 1 for x in x_train], MAX_LEN)


# The tests' shrunk config, as --config.* overrides.
FLAGS = {"model.num_words": 200, "model.max_len": MAX_LEN,
         "data.bucket": BUCKET, "model.embed_dim": 16, "model.filters": 16,
         "train.steps": 40, "train.batch_size": BATCH,
         "train.steps_per_loop": 20, "eval.every_steps": 0,
         "eval.batch_size": 100, "checkpoint.every_steps": 0,
         "optimizer.learning_rate": 0.01}


def _config(data_dir):
  return configured(tc.get_config(), FLAGS, data__dir=str(data_dir))


def _bucket_length(num_tokens):
  return -(-np.asarray(num_tokens) // BUCKET) * BUCKET


def test_train_pipeline_feeds_four_shapes(data):
  """One epoch of what looper feeds the train step (its distributed
  dataset, one replica; and one pipeline's batches for two replicas):
  the four bucket lengths, each batch holding reviews of its bucket."""
  data_dir, num_tokens = data
  c = _config(data_dir)
  lc.validate(c)
  trainer = pieces.trainer(c, distribute.strategy_for(c.distribution))
  # How many batches an epoch has, from the reviews' lengths alone: each
  # bucket's whole batches (its last partial one waits for no one).
  counts = {length: int(np.sum(_bucket_length(num_tokens) == length))
            for length in (16, 32, 48, 64)}
  assert min(counts.values()) >= BATCH  # all four buckets fill a batch
  epoch = sum(n // BATCH for n in counts.values())
  batches = trainer.input.train_iterator()
  shapes, fed = [], []
  for _ in range(epoch):
    tokens, _ = next(batches)
    tokens = tokens.numpy()
    shapes.append(tokens.shape)
    lengths = np.count_nonzero(tokens, axis=1)  # ids are >= 1 but the pad
    np.testing.assert_array_equal(_bucket_length(lengths), tokens.shape[1])
    fed += [tuple(row[:n]) for row, n in zip(tokens, lengths)]
  assert set(shapes) == {(32, 16), (32, 32), (32, 48), (32, 64)}
  assert {s[1]: shapes.count(s) for s in set(shapes)} == {
      length: n // BATCH for length, n in counts.items()}
  # Each review at most once; all but each bucket's remainder.
  assert len(set(fed)) == len(fed) == epoch * BATCH
  assert len(fed) == NUM_TRAIN - sum(n % BATCH for n in counts.values())
  # Two replicas: each gets half of every global batch, at its length.
  two = trainer.input.source(c.data.train_split).train(
      tf.distribute.InputContext(1, 0, 2), batch_size=BATCH,
      seed=c.seed, shuffle_buffer=c.data.shuffle_buffer, position=0)
  per_replica = [x.shape for x, _ in two.take(2 * epoch)]
  assert per_replica[::2] == per_replica[1::2]
  assert set(per_replica) == {(16, 16), (16, 32), (16, 48), (16, 64)}


def test_model_output_ignores_padding(data):
  data_dir, _ = data
  c = _config(data_dir)
  model = tc.model_fn(c)
  assert model.input_shape == (None, None) and model.input.dtype == "int32"
  assert model.output_shape == (None, 2) and model.output.dtype == "float32"
  short = [x for x, _ in tc.dataset_fn(c, "test").as_numpy_iterator()
           if len(x) <= 16][:5]
  assert len(short) == 5
  padded = lambda length: np.stack([np.pad(x, (0, length - len(x)))
                                    for x in short])
  at_16 = model(padded(16)).numpy()
  np.testing.assert_allclose(model(padded(64)).numpy(), at_16, atol=1e-5)
  np.testing.assert_allclose(model(padded(160)).numpy(), at_16, atol=1e-5)
  # Not a constant: different reviews get different logits.
  assert np.ptp(at_16, axis=0).max() > 1e-3
  # looper's eval filler is all padding: finite logits, not NaN.
  assert np.isfinite(model(np.zeros((2, 16), np.int32)).numpy()).all()


def test_reviews_keep_their_first_max_len_tokens(data):
  """data.bucket > 0: each review at its own length; 0: all at max_len."""
  data_dir, num_tokens = data
  c = _config(data_dir)
  own = list(tc.dataset_fn(c, "train[:50]").as_numpy_iterator())
  assert tc.dataset_fn(c, "train").element_spec[0].shape.as_list() == [None]
  assert [len(x) for x, _ in own] == num_tokens[:50].tolist()
  assert all(x[0] == 1 and x.all() for x, _ in own)  # the start id, no pad
  c.data.bucket = 0
  padded = tc.dataset_fn(c, "train[:50]")
  assert padded.element_spec[0].shape == (MAX_LEN,)
  for (x, y), (px, py) in zip(own, padded.as_numpy_iterator(), strict=True):
    np.testing.assert_array_equal(px, np.pad(x, (0, MAX_LEN - len(x))))
    assert py == y


def test_config_checks_are_one_line(data):
  data_dir, _ = data
  c = _config(data_dir)
  c.model.max_len = 70
  with pytest.raises(lc.ConfigError) as e:
    tc.model_fn(c)
  assert str(e.value) == (
      "config.model.max_len=70 is not a multiple of config.data.bucket=16,"
      " so the longest batches would be padded past it; set"
      " --config.model.max_len=80")
  c.data.bucket = 0  # one shape, max_len: any length will do
  tc.check_config(c)
  c.model.num_words = 3
  with pytest.raises(lc.ConfigError, match=r"^config\.model\.num_words=3 .*"
                     "--config.model.num_words=20000 or similar$"):
    tc.dataset_fn(c, "train")
  lc.validate(tc.get_config())
  tc.check_config(tc.get_config())
  for field in ("num_words", "max_len", "embed_dim", "filters"):
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(configured(_config(data_dir), {f"model.{field}": 0}))
    assert str(e.value) == (f"config.model.{field}=0: must be a whole number"
                            f" >= 1; set --config.model.{field}")


@pytest.mark.slow  # trains for seconds
def test_trains_end_to_end_with_the_same_curve_on_two_replicas(data,
                                                              tmp_path):
  """On one replica, then on two (the session's logical CPUs): the model
  learns the sentiment words (chance: 50%), and the per-step
  losses agree (the same examples per step, each replica at the global
  batch's length)."""
  data_dir, _ = data
  result = run.run(_config(data_dir), str(tmp_path / "one"),
                   mode="train_and_eval")
  assert result["step"] == 40
  assert result["eval"]["examples"] == NUM_TEST
  assert result["eval"]["accuracy"] >= 0.9, result["eval"]

  run_here("--config=experiments/text_classifier.py",
           f"--workdir={tmp_path / 'two'}", f"--config.data.dir={data_dir}",
           *[f"--config.{k}={v}" for k, v in FLAGS.items()],
           "--config.distribution.num_cpu_devices=2")
  two = curve(tmp_path / "two" / "train")
  assert len(two) == 40
  np.testing.assert_allclose(two, curve(tmp_path / "one" / "train"),
                             atol=1e-6)
  assert scalars(tmp_path / "two" / "eval", "accuracy")[40] == pytest.approx(
      result["eval"]["accuracy"])


@pytest.mark.slow  # trains or compiles for seconds
def test_ready_for_a_tpu(data):
  """`looper check` passes it: 8 per core, at most max_len / bucket shapes."""
  from looper.cli import tpu_check  # pylint: disable=g-import-not-at-top
  c = _config(data[0])
  c.train.batch_size = c.eval.batch_size = 64
  assert tpu_check.check(c, cores=8) == []
