"""Tests of experiments/imdb_lstm.py: the imdb.npz loader, Keras' id
conventions, the model, and training end to end under XLA.

Run::

    cd /work/main && PYTHONPATH=. python -m pytest -q tests/unit/experiments/test_imdb_lstm.py

The data is generated here in Keras' imdb.npz format (object arrays of word
rank lists, written by np.savez); a review is positive iff it holds words of
ranks 11-15, negative iff of ranks 16-20. Nothing leaves the machine.
"""

import os

import keras
from keras.src.datasets import imdb as keras_imdb
import numpy as np
import pytest

from experiments import imdb_lstm
from looper import config as lc
from looper import run
from tests.fixtures.checkpoints import restored_trainer
from tests.fixtures.configs import configured
from tests.fixtures.processes import serve_in_fresh_process
from tests.unit.experiments.test_mnist import keras_download

POSITIVE, NEGATIVE = (11, 12, 13, 14, 15), (16, 17, 18, 19, 20)
NUM_TRAIN, NUM_TEST = 800, 200


def reviews(num: int, seed: int):
  """`num` reviews of 8-99 word ranks in 21..399, three sentiment words each
  among the last 40 (so they survive cutting to the last 48 tokens)."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, num)
  xs = np.empty(num, dtype=object)  # ragged: a list per review, as Keras'
  for i in range(num):
    length = int(rng.integers(8, 100))
    words = rng.integers(21, 400, length).tolist()
    cues = POSITIVE if labels[i] else NEGATIVE
    for p in rng.choice(np.arange(max(0, length - 40), length), 3,
                        replace=False):
      words[p] = int(rng.choice(cues))
    xs[i] = words
  return xs, labels


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("imdb")
  x_train, y_train = reviews(NUM_TRAIN, seed=0)
  x_test, y_test = reviews(NUM_TEST, seed=1)
  np.savez(directory / "imdb.npz", x_train=x_train, y_train=y_train,
           x_test=x_test, y_test=y_test)
  return directory


def _config(data_dir, **model):
  small = {**dict(num_words=200, seq_len=48, embed_dim=16, units=16), **model}
  return configured(imdb_lstm.get_config(), {
      "data.dir": str(data_dir), **{f"model.{k}": v for k, v in small.items()}})


def test_get_config_validates_and_downloads_what_keras_checks(monkeypatch):
  c = imdb_lstm.get_config()
  lc.validate(c)
  assert (c.data.url, c.data.file_hash) == keras_download(monkeypatch,
                                                          keras_imdb)


def test_keras_id_conventions_by_hand():
  # Ranks 1, 5, 20000 -> ids 1+3, 5+3, oov (>= num_words=10); a start id
  # in front of every review.
  ids = imdb_lstm.encode([[1, 5, 20000], [7]], num_words=10)
  assert [list(x) for x in ids] == [[1, 4, 8, 2], [1, 2]]
  # Longer reviews keep their end, shorter ones are padded in front.
  np.testing.assert_array_equal(imdb_lstm.pad_front(ids, 3),
                                [[4, 8, 2], [0, 1, 2]])


def test_tokens_equal_keras_load_data(data_dir, monkeypatch, no_network):
  """Our encoding of the file equals keras.datasets.imdb.load_data's plus
  keras.utils.pad_sequences' defaults (cut and pad in front)."""
  monkeypatch.setattr(keras_imdb, "get_file",
                      lambda *a, **k: str(data_dir / "imdb.npz"))
  (x_train, y_train), (x_test, y_test) = keras_imdb.load_data(num_words=200)
  # load_data shuffles train, then test, with one RandomState(113).
  rng = np.random.RandomState(113)
  order_train, order_test = np.arange(NUM_TRAIN), np.arange(NUM_TEST)
  rng.shuffle(order_train)
  rng.shuffle(order_test)
  c = _config(data_dir)
  for split, order, x, y in (("train", order_train, x_train, y_train),
                             ("test", order_test, x_test, y_test)):
    tokens, labels = imdb_lstm.dataset_fn(c, split)
    assert tokens.dtype == np.int32 and tokens.shape == (len(x), 48)
    assert labels.dtype == np.int32
    np.testing.assert_array_equal(tokens[order],
                                  keras.utils.pad_sequences(x, maxlen=48))
    np.testing.assert_array_equal(labels[order], y)
  assert tokens.max() == 199 and (tokens == imdb_lstm.OOV_CHAR).any()


def test_slices(data_dir, no_network):
  c = _config(data_dir)
  everything, labels = imdb_lstm.dataset_fn(c, "train")
  head, head_labels = imdb_lstm.dataset_fn(c, "train[:100]")
  np.testing.assert_array_equal(head, everything[:100])
  np.testing.assert_array_equal(head_labels, labels[:100])
  tail, _ = imdb_lstm.dataset_fn(c, "test[75%:]")
  assert len(tail) == NUM_TEST // 4
  c.data.train_split = "train[900:]"  # past the 800 reviews
  with pytest.raises(lc.ConfigError,
                     match=r"config\.data\.train_split='train\[900:\]'"):
    imdb_lstm.dataset_fn(c, c.data.train_split)


def test_missing_file_names_data_dir(tmp_path, no_network):
  with pytest.raises(lc.ConfigError) as e:
    imdb_lstm.dataset_fn(_config(tmp_path), "train")
  message = str(e.value)
  assert "\n" not in message
  assert "config.data.dir" in message and str(tmp_path) in message
  assert "imdb.npz" in message


def test_unknown_split_names_the_field(data_dir):
  c = _config(data_dir)
  c.data.eval_split = "validation"
  with pytest.raises(lc.ConfigError, match=r"config\.data\.eval_split=.*"
                     "'train' or 'test'"):
    imdb_lstm.dataset_fn(c, "validation")


class _Payload:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):  # what unpickling would run: create the marker
    return (open, (self.marker, "w"))


def test_file_that_would_run_code_is_refused(tmp_path, no_network):
  marker = tmp_path / "ran"
  x = np.empty(1, dtype=object)
  x[0] = _Payload(str(marker))
  np.savez(tmp_path / "imdb.npz", x_train=x, y_train=np.zeros(1),
           x_test=x, y_test=np.zeros(1))
  with pytest.raises(lc.ConfigError) as e:
    imdb_lstm.dataset_fn(_config(tmp_path), "train")
  assert "\n" not in str(e.value)
  assert str(tmp_path / "imdb.npz") in str(e.value) and "open" in str(e.value)
  assert not marker.exists()


def test_truncated_file_names_the_file(data_dir, tmp_path, no_network):
  (tmp_path / "imdb.npz").write_bytes(
      (data_dir / "imdb.npz").read_bytes()[:5000])
  with pytest.raises(lc.ConfigError, match="not a valid IMDB file") as e:
    imdb_lstm.dataset_fn(_config(tmp_path), "test")
  assert str(tmp_path / "imdb.npz") in str(e.value)


def test_model_shapes_and_dtypes(data_dir):
  c = _config(data_dir)
  model = imdb_lstm.model_fn(c)
  assert model.input_shape == (None, 48)  # no fixed batch: any batch serves
  assert model.input.dtype == "int32"
  assert model.output_shape == (None, 2) and model.output.dtype == "float32"
  tokens, _ = imdb_lstm.dataset_fn(c, "test[:7]")
  assert model(tokens).shape == (7, 2)
  lstm = next(l for l in model.layers if isinstance(l, keras.layers.LSTM))
  assert lstm.use_cudnn == "auto"
  c.train.jit_compile = True  # cuDNN's kernel does not compile with XLA
  lstm = next(l for l in imdb_lstm.model_fn(c).layers
              if isinstance(l, keras.layers.LSTM))
  assert lstm.use_cudnn is False


def test_bad_sizes_are_one_line(data_dir):
  for field in ("num_words", "seq_len", "embed_dim", "units"):
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(_config(data_dir, **{field: 0}))
    assert str(e.value) == (f"config.model.{field}=0: must be a whole number"
                            f" >= 1; set --config.model.{field}")
  c = _config(data_dir, num_words=3)  # validates, but ids 0-2 are reserved
  lc.validate(c)
  with pytest.raises(lc.ConfigError) as e:
    imdb_lstm.model_fn(c)
  assert str(e.value) == (
      "config.model.num_words=3 keeps no word: ids 0-2 are reserved and words"
      " start at 3; set --config.model.num_words=20000 or similar")
  imdb_lstm.model_fn(_config(data_dir, num_words=4))  # one word: id 3


@pytest.mark.slow  # a subprocess
def test_trains_end_to_end_under_xla(data_dir, tmp_path):
  """looper.run with each step XLA-compiled (train.jit_compile): the model
  learns the sentiment words (chance: 50%)."""
  c = _config(data_dir)
  c.train.update(steps=40, batch_size=32, steps_per_loop=20,
                 jit_compile=True)
  c.eval.update(every_steps=0, batch_size=100)
  c.checkpoint.every_steps = 0
  c.optimizer.learning_rate = 0.01
  c.export.at_end = True
  result = run.run(c, str(tmp_path / "run"), mode="train_and_eval")
  assert result["step"] == 40
  assert result["eval"]["examples"] == NUM_TEST
  # Measured: 1.0 after 40 steps (eval loss 0.085).
  assert result["eval"]["accuracy"] >= 0.9, result["eval"]
  assert os.path.exists(tmp_path / "run" / "checkpoints" / "ckpt-40.index")

  # Trained at a static batch of 32, served at any batch: a fresh process
  # with TensorFlow only, rows padded in front exactly like training.
  tokens, _ = imdb_lstm.dataset_fn(c, "test[:64]")
  served = serve_in_fresh_process(result["export"], tokens, tmp_path)
  assert served["input"] == [[None, c.model.seq_len], "int32"]
  assert not served["looper_imported"]
  trainer = restored_trainer(c, tmp_path / "run" / "checkpoints" / "ckpt-40")
  expected = trainer.model(tokens, training=False).numpy()
  for n in (1, 7, 64):
    np.testing.assert_allclose(served[str(n)], expected[:n], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.slow  # trains or compiles for seconds
def test_ready_for_a_tpu(data_dir):
  """`looper check` passes the shipped config (a smaller LSTM: same ops)."""
  from looper.cli import tpu_check  # pylint: disable=g-import-not-at-top
  assert tpu_check.check(_config(data_dir), cores=8) == []
