"""IMDB sentiment with an Embedding + LSTM, trained at one static shape.

Synopsis::

    # Full IMDB (25,000 train / 25,000 test reviews): read from
    # ~/.cache/looper/imdb, downloaded there once (Keras' imdb.npz).
    python -m looper.main --config=experiments/imdb_lstm.py --workdir=/tmp/imdb

    # Offline: a folder holding imdb.npz; hold out part of 'train'.
    python -m looper.main --config=experiments/imdb_lstm.py \
        --workdir=/tmp/imdb --config.data.dir=/data/imdb \
        --config.data.train_split='train[:90%]' \
        --config.data.eval_split='train[90%:]'

    # From Python (a notebook, a test):
    from experiments import imdb_lstm
    config = imdb_lstm.get_config()
    model = imdb_lstm.model_fn(config)    # int32 [batch, seq_len] -> logits
    tokens, labels = imdb_lstm.dataset_fn(config, "test[:1000]")

The file is the `imdb.npz` `keras.datasets.imdb.load_data()` reads: x_train,
y_train, x_test, y_test, each x an object array of reviews, a review a list of
word ranks (1 = the most frequent word). Token ids follow Keras' conventions:
0 pads, 1 starts a review, 2 stands for a word outside the `model.num_words`
most frequent, and rank r becomes id r + 3.

Shapes: every review is cut or padded to `model.seq_len` tokens in
`dataset_fn`, and every train batch looper makes holds `train.batch_size`
reviews, so training runs at one static shape (XLA compiles once). The
model's Input fixes no batch size, so the same weights serve any batch.
"""

import io
import os
import pickle
import zipfile

import keras
import ml_collections
import numpy as np

from experiments import common
from looper import config as lc
from looper.data import datasets

DEFAULT_URL = (
    "https://storage.googleapis.com/tensorflow/tf-keras-datasets/imdb.npz")
# keras.datasets.imdb's published sha256 of that file.
DEFAULT_HASH = (
    "69664113be75683a8fe16e3ed0ab59fda8886cb3cd7ada244f7d9544e4676b9f")
DEFAULT_CACHE_DIR = "~/.cache/looper/imdb"
NPZ_NAME = "imdb.npz"
SPLITS = ("train", "test")
# Keras' id conventions (keras.datasets.imdb.load_data's defaults).
PAD, START_CHAR, OOV_CHAR, INDEX_FROM = 0, 1, 2, 3
# What unpickling an object array of lists may construct: numpy's own
# rebuilders under numpy 1 and 2 names. Anything else in a file (a crafted
# pickle that would run code) is refused.
_NUMPY_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct")})


def get_config() -> ml_collections.ConfigDict:
  """Returns the config: about 2 epochs of batch 64 over the 25,000 reviews."""
  # 25,000 test reviews are exactly 25 batches of 1000: no padded batch
  # (and 1000 splits over 8 TPU cores).
  c = common.config(model_fn, dataset_fn, steps=800, batch_size=64,
                    steps_per_loop=100, eval_every=400, eval_batch_size=1000,
                    optimizer="adam", learning_rate=1e-3, schedule="cosine")
  # Over 200 steps an LSTM's gradients can explode; clipping is the usual
  # guard.
  c.optimizer.clip_global_norm = 1.0

  c.data.train_split = "train"
  c.data.eval_split = "test"
  datasets.add_fields(c, cache_dir=DEFAULT_CACHE_DIR, url=DEFAULT_URL,
                      file_hash=DEFAULT_HASH)

  # Keep the num_words most frequent words; rarer ones become OOV_CHAR.
  c.model.num_words = lc.whole(20_000)
  # Tokens per review: longer ones keep their last seq_len tokens, shorter
  # ones are padded in front (Keras' pad_sequences defaults), so the LSTM's
  # last state follows the review's last words.
  c.model.seq_len = lc.whole(200)
  c.model.embed_dim = lc.whole(64)
  c.model.units = lc.whole(64)
  return c


def model_fn(config: ml_collections.ConfigDict) -> keras.Model:
  """Returns Embedding -> LSTM -> Dense(2): token ids to 2 logits.

  Two logits (negative, positive) rather than one sigmoid output: looper's
  default loss (sparse categorical cross-entropy) and accuracy metric apply
  unchanged.

  Args:
    config: reads `model.num_words`, `model.seq_len`, `model.embed_dim`,
      `model.units` and `train.jit_compile`.

  Raises:
    ConfigError: num_words leaves no room for a word after the reserved ids
      (`lc.validate` checks the declared sizes).
  """
  check_num_words(config.model)
  tokens = keras.Input(shape=(config.model.seq_len,), dtype="int32",
                       name="tokens")
  x = keras.layers.Embedding(config.model.num_words, config.model.embed_dim)(
      tokens)
  # No mask: padding sits in front, where the LSTM reads it first and the
  # last state forgets it. On a GPU Keras would run cuDNN's LSTM, which XLA
  # cannot compile, so under train.jit_compile the generic loop is forced
  # (on CPU and TPU it is what runs anyway).
  x = keras.layers.LSTM(
      config.model.units,
      use_cudnn=False if config.train.jit_compile else "auto")(x)
  # float32 even under a mixed precision policy: the loss needs it.
  logits = keras.layers.Dense(2, dtype="float32", name="logits")(x)
  return keras.Model(tokens, logits, name="imdb_lstm")


def check_num_words(model: ml_collections.ConfigDict) -> None:
  """A ConfigError unless model.num_words keeps a word after the reserved
  ids (text_classifier's too)."""
  if model.num_words <= INDEX_FROM:
    raise lc.ConfigError(
        f"config.model.num_words={model.num_words} keeps no word: ids 0-2 are"
        f" reserved and words start at {INDEX_FROM}; set"
        " --config.model.num_words=20000 or similar")


def dataset_fn(config: ml_collections.ConfigDict, split: str):
  """Returns the `split` reviews as arrays, in the file's order.

  Args:
    config: reads `data.*` (where the file is) and `model.num_words`,
      `model.seq_len`.
    split: 'train' or 'test' with an optional slice: 'train[:90%]'.

  Returns:
    (tokens int32 [N, seq_len], labels int32 [N], 1 = positive): numpy
    arrays, so looper shuffles fully by index (array mode).

  Raises:
    ConfigError: a bad split, a missing or corrupt file, a failed download.
  """
  reviews, labels = load_split(config, split)
  return pad_front(encode(reviews, config.model.num_words),
                   config.model.seq_len), labels


def load_split(config: ml_collections.ConfigDict, split: str):
  """(reviews, labels) of `split`, a slice of 'train' or 'test', unencoded.

  Raises:
    ConfigError: an unknown split name or an empty slice (naming the
      data.*_split field), or what `load_imdb` raises.
  """
  field, name = common.split_name(config, split, SPLITS, dataset="IMDB",
                                  sliced="train[:90%]")
  reviews, labels = load_imdb(name, config.data)
  _, selected = lc.split_slice(split, len(labels), field=field)
  return reviews[selected], labels[selected]


def load_imdb(name: str, data: ml_collections.ConfigDict):
  """Returns one split as (reviews: object array of int arrays, labels int32).

  The word ranks are as stored (1 = the most frequent word); `encode` turns
  them into token ids.

  Args:
    name: 'train' or 'test' (no slice).
    data: the config's `data` block (see looper/data/datasets.py): `dir` if set,
      else `cache_dir`, filled from `url` the first time.

  Raises:
    ConfigError: data.dir set but without imdb.npz; a corrupt file; nothing
      cached and the download failed.
  """
  field = "data.dir" if data.get("dir") else "data.cache_dir"

  def find(directory):
    path = os.path.join(directory, NPZ_NAME)
    return _read_npz(path, name, field) if os.path.isfile(path) else None

  return datasets.locate(data, "IMDB", find, expected=NPZ_NAME)


def encode(reviews, num_words: int) -> list[np.ndarray]:
  """Word ranks to token ids, as keras.datasets.imdb.load_data does.

  [r1, r2, ...] -> [START_CHAR, r1 + INDEX_FROM, ...], and every id >=
  num_words -> OOV_CHAR.
  """
  encoded = []
  for review in reviews:
    ids = np.concatenate([[START_CHAR],
                          np.asarray(review, np.int64) + INDEX_FROM])
    encoded.append(np.where(ids < num_words, ids, OOV_CHAR).astype(np.int32))
  return encoded


def pad_front(ids: list[np.ndarray], seq_len: int) -> np.ndarray:
  """[N, seq_len]: each sequence's last seq_len ids, zeros in front."""
  out = np.full((len(ids), seq_len), PAD, np.int32)
  for row, sequence in zip(out, ids):
    kept = sequence[-seq_len:]
    row[seq_len - len(kept):] = kept
  return out


def _corrupt(path: str, field: str, what: str) -> lc.ConfigError:
  return lc.ConfigError(
      f"config.{field}: {path} is not a valid IMDB file ({what}); replace it"
      f" with the original or delete it")


def _read_npz(path: str, name: str, field: str):
  try:
    with zipfile.ZipFile(path) as archive:
      reviews = _read_member(archive, f"x_{name}.npy")
      labels = _read_member(archive, f"y_{name}.npy")
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile,
          pickle.UnpicklingError) as e:
    raise _corrupt(path, field, " ".join(str(e).split())) from None
  if (reviews.ndim < 1 or labels.shape != reviews.shape[:1] or
      not np.isin(labels, (0, 1)).all()):
    raise _corrupt(path, field, f"x_{name} {reviews.shape}, y_{name}"
                   f" {labels.shape} with values {np.unique(labels)[:5]}")
  return reviews, labels.astype(np.int32)


def _read_member(archive: zipfile.ZipFile, member: str) -> np.ndarray:
  """One .npy of the archive; an object array through `_ArraysOnly`."""
  with archive.open(member) as raw:
    f = io.BytesIO(raw.read())
  version = np.lib.format.read_magic(f)
  # Format 3.0 differs from 2.0 only in the header's text encoding.
  read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                 else np.lib.format.read_array_header_2_0)
  _, _, dtype = read_header(f)
  if dtype.hasobject:  # ragged reviews: numpy pickles them
    return _ArraysOnly(f).load()
  f.seek(0)
  return np.lib.format.read_array(f, allow_pickle=False)


class _ArraysOnly(pickle.Unpickler):
  """Unpickles numpy arrays of Python lists and ints, and nothing else.

  np.load(allow_pickle=True) would run any code a tampered file holds.
  """

  def find_class(self, module, name):
    if (module, name) not in _NUMPY_GLOBALS:
      raise pickle.UnpicklingError(
          f"it asks to construct {module}.{name}, which a dataset never needs")
    return super().find_class(module, name)
