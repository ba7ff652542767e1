"""MNIST (and Fashion-MNIST) with the CNN from TensorFlow's "Use TPUs" guide.

Synopsis::

    # Full MNIST: read from ~/.cache/looper/mnist, downloaded there once.
    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist

    # Fashion-MNIST (the same IDX files; keras.datasets.fashion_mnist
    # .load_data() downloads them there) with the TensorFlow layers
    # tutorial's CNN, 0.916 in the dataset's table of results:
    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/fm \
        --config.data.dir=~/.keras/datasets/fashion-mnist \
        --config.model.arch=tutorial
    # looper's recipe for >= 0.93 there: docs/pages/experiment.md.

    # Offline, anywhere: the real MNIST test set this repository carries
    # (experiments/data/mnist), split 8000/2000, a narrower CNN.
    python -m looper.main --config=experiments/mnist.py:bundled \
        --workdir=/tmp/mnist

    # From Python (a notebook, a test):
    from experiments import mnist
    config = mnist.get_config()
    model = mnist.model_fn(config)                  # logits, not softmax
    images, labels = mnist.dataset_fn(config, "test[:8000]")  # arrays

Where the files come from: `config.data.dir` if it is set (never a download),
else `config.data.cache_dir`, which is filled from `config.data.url` the first
time. Either folder may hold the original IDX files
(`{train,t10k}-{images-idx3,labels-idx1}-ubyte`, gzipped or not) or the
`mnist.npz` Keras publishes (keys x_train, y_train, x_test, y_test).

The split comes as numpy arrays (array mode): it fits in memory (the
60,000 train images are 188 MB as float32), looper shuffles it by index
and each input pipeline gathers only its rows, so the input never holds
back the step (element mode's per-example pipeline made the guide's CNN
wait 15-18% of its time on 2 CPU cores).
"""

import gzip
import os
import pathlib
import zipfile

import keras
import ml_collections
from ml_collections import config_dict
import numpy as np

from experiments import common
from looper import config as lc
from looper import sweep
from looper.data import datasets
from looper.train import layers

DEFAULT_URL = (
    "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz")
# keras.datasets.mnist's published sha256 of that file.
DEFAULT_HASH = (
    "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1")
DEFAULT_CACHE_DIR = "~/.cache/looper/mnist"
NPZ_NAME = "mnist.npz"
# Split name -> (IDX file prefix, npz key suffix): MNIST's test files are
# called t10k-*, and Keras' npz stores them as x_test / y_test.
SPLITS = {"train": ("train", "train"), "test": ("t10k", "test")}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049
_ROWS = _COLS = 28


# The real MNIST test set in this repository (1.6 MB; its README names the
# authors and the CC BY-SA 3.0 licence): offline runs, the tests.
BUNDLED_DIR = pathlib.Path(__file__).resolve().parent / "data" / "mnist"
# `--config=experiments/mnist.py:NAME` -> what the preset sets.
PRESETS = {
    "": {},
    # The bundled test set: 8000 images to train on, 2000 held out, a CNN
    # of width 32, 1000 steps of 64 (97.9% in ~20 s on 2 CPU cores: README).
    "bundled": {"data.dir": str(BUNDLED_DIR),
                "data.train_split": "test[:8000]",
                "data.eval_split": "test[8000:]", "model.width": 32,
                "train.batch_size": 64, "train.steps": 1000},
}


def get_config(preset: str = "") -> ml_collections.ConfigDict:
  """Returns the config of a TPU-guide-like run: 2000 steps of batch 128,
  changed by a PRESETS entry (`--config=experiments/mnist.py:bundled`)."""
  if preset not in PRESETS:
    raise lc.ConfigError(
        # The loader names the file and line before this.
        f"no such preset {preset!r}; use one of"
        f" {', '.join(repr(p) for p in PRESETS)} (after the ':')")
  # Eval: 10,000 test images are exactly 25 batches of 400 (no padded last
  # batch), and 400 splits over 8 TPU cores. The cosine decay to 0 at
  # train.steps: +0.8% eval accuracy over a constant rate here.
  c = common.config(model_fn, dataset_fn, steps=2000, batch_size=128,
                    steps_per_loop=100, eval_every=500, eval_batch_size=400,
                    optimizer="adam", learning_rate=1e-3, schedule="cosine")

  # MNIST has only 'train' (60,000) and 'test' (10,000); slice them to hold
  # out data, e.g. 'train[:90%]' and 'train[90%:]'.
  c.data.train_split = "train"
  c.data.eval_split = "test"
  # Where the npz Keras' mnist.load_data() downloads (checked against its
  # published sha256) lands and is looked for when data.dir is empty.
  datasets.add_fields(c, cache_dir=DEFAULT_CACHE_DIR, url=DEFAULT_URL,
                      file_hash=DEFAULT_HASH)

  # The network, from ARCHS: 'guide' (the TPU guide's: two 3x3 convs, two
  # dense layers), 'tutorial' (TensorFlow's layers tutorial: conv 32 5x5,
  # pool, conv 64 5x5, pool, dense 1024, dropout 0.4; Fashion-MNIST's table
  # lists it at 0.916), 'tutorial_bn' (the same with synchronized batch
  # norm after each conv and the dense layer; the table's "2 Conv+pooling+BN",
  # 0.934).
  c.model.arch = "guide"
  # guide: filters of both convs and units of the first dense layer (the
  # second has half, so >= 2); the guide uses 256, 16-32 is plenty for a
  # CPU run.
  c.model.width = lc.whole(256, low=2)
  # Dropout before the logits (None: the network's own, 0 for the guide,
  # 0.4 for the tutorial's).
  c.model.dropout = config_dict.placeholder(float)
  # Flip each train image left-right with probability 1/2 (looper's
  # RandomFlip, the same on any replica count): for clothes, not digits.
  c.model.flip = lc.boolean(False)
  c.update_from_flattened_dict(PRESETS[preset])
  return c


def get_sweep(preset: str = "") -> sweep.Sweep:
  """What `looper sweep --config=experiments/mnist.py:bundled` tunes: the
  learning rate and the width (README "Sweeps")."""
  del preset  # one space for every preset
  return sweep.Sweep(
      space={"optimizer.learning_rate": sweep.Float(1e-4, 1e-2, log=True),
             "model.width": sweep.Int(8, 64, step=8)},
      objective="eval/accuracy", direction="maximize")


def _guide(config, x):
  """The TPU guide's CNN body (width: config.model.width)."""
  width = config.model.width
  x = keras.layers.Conv2D(width, 3, activation="relu")(x)
  x = keras.layers.Conv2D(width, 3, activation="relu")(x)
  x = keras.layers.Flatten()(x)
  x = keras.layers.Dense(width, activation="relu")(x)
  return keras.layers.Dense(width // 2, activation="relu")(x), 0.0


def _tutorial(config, x, norm: bool = False):
  """TensorFlow's layers tutorial CNN body; `norm`: batch norm after each
  conv and the dense layer (synchronized: the same statistics on any
  replica count)."""
  del config
  def block(layer, x):
    if not norm:
      return layer(x)
    x = keras.layers.BatchNormalization(synchronized=True)(layer(x))
    return keras.layers.Activation("relu")(x)
  act = None if norm else "relu"
  for filters in (32, 64):
    x = block(keras.layers.Conv2D(filters, 5, padding="same",
                                  activation=act, use_bias=not norm), x)
    x = keras.layers.MaxPooling2D(2)(x)
  x = keras.layers.Flatten()(x)
  return block(keras.layers.Dense(1024, activation=act, use_bias=not norm),
               x), 0.4


# config.model.arch -> body(config, images) -> (features, its dropout).
ARCHS = {
    "guide": _guide,
    "tutorial": _tutorial,
    "tutorial_bn": lambda config, x: _tutorial(config, x, norm=True),
}


def model_fn(config: ml_collections.ConfigDict) -> keras.Model:
  """Returns the `config.model.arch` CNN; it maps images to 10 logits (no
  softmax).

  Args:
    config: reads `model.arch`, `model.width` (guide), `model.dropout`
      and `model.flip`.

  Raises:
    ConfigError: an unknown arch (`lc.validate` checks the declared width
      and flip).
  """
  arch = config.model.get("arch", "guide")
  if arch not in ARCHS:
    raise lc.ConfigError(
        f"config.model.arch={arch!r} is not one of {', '.join(ARCHS)}; set"
        f" --config.model.arch")
  inputs = keras.Input(shape=(_ROWS, _COLS, 1), name="images")
  x = inputs
  if config.model.get("flip"):  # looper's: the same on any replica count
    x = layers.RandomFlip(seed=config.seed + 1)(x)
  x, own_dropout = ARCHS[arch](config, x)
  dropout = config.model.get("dropout")
  dropout = own_dropout if dropout is None else dropout
  if dropout:  # looper's: same masks on any replica count
    x = layers.Dropout(dropout, seed=config.seed)(x)
  # float32 even under a mixed_float16 policy: the loss and softmax need it.
  logits = keras.layers.Dense(10, dtype="float32", name="logits")(x)
  return keras.Model(inputs, logits, name="mnist_cnn")


def dataset_fn(config: ml_collections.ConfigDict, split: str):
  """Returns the `split` examples as arrays, in the files' order.

  Args:
    config: reads `data.dir`, `data.cache_dir`, `data.url` and, to name the
      field in errors, `data.train_split`.
    split: 'train' or 'test' with an optional slice: 'test[:8000]',
      'test[8000:]', 'train[:90%]'.

  Returns:
    (images, labels) numpy arrays: float32 [N, 28, 28, 1] in [0, 1], int32
    [N]. The framework shuffles, batches and shards them (array mode).

  Raises:
    ConfigError: a bad split, missing or corrupt files, a failed download.
  """
  field, name = common.split_name(config, split, SPLITS, dataset="MNIST",
                                  sliced="test[:8000]")
  images, labels = load_mnist(name, config.data)
  _, selected = lc.split_slice(split, len(labels), field=field)
  images = images[selected].astype(np.float32)[..., np.newaxis]
  return images / np.float32(255.0), labels[selected].astype(np.int32)


def load_mnist(name: str, data: ml_collections.ConfigDict):
  """Split `name` ('train' or 'test', no slice) of the IDX files or npz
  `data` points at (see `common.locate`) as (images uint8 [N, 28, 28],
  labels uint8 [N]); a ConfigError for an unknown name, missing or corrupt
  files, or a failed download."""
  return common.locate(data, name, SPLITS, _load_from, dataset="MNIST",
                       what=f"MNIST {name!r}", expected=_expected_files(name))


def _expected_files(name: str) -> str:
  prefix = SPLITS[name][0]
  return (f"{prefix}-images-idx3-ubyte[.gz] and {prefix}-labels-idx1-ubyte"
          f"[.gz], or {NPZ_NAME}")


def _find(directory: str, stem: str):
  for path in (os.path.join(directory, stem + ".gz"),
               os.path.join(directory, stem)):
    if os.path.isfile(path):
      return path
  return None


def _load_from(directory: str, name: str, field: str):
  """Returns (images, labels) from `directory`, or None if it has no files."""
  prefix = SPLITS[name][0]
  images_path = _find(directory, f"{prefix}-images-idx3-ubyte")
  labels_path = _find(directory, f"{prefix}-labels-idx1-ubyte")
  if images_path and labels_path:
    images = _read_idx(images_path, _IMAGES_MAGIC, field)
    labels = _read_idx(labels_path, _LABELS_MAGIC, field)
    if len(images) != len(labels):
      raise lc.ConfigError(
          f"config.{field}: {images_path} has {len(images)} images but"
          f" {labels_path} has {len(labels)} labels; replace them with a"
          f" matching original pair")
    return images, labels
  npz_path = os.path.join(directory, NPZ_NAME)
  if os.path.isfile(npz_path):
    return _read_npz(npz_path, name, field)
  return None


def _corrupt(path: str, field: str, what: str) -> lc.ConfigError:
  return lc.ConfigError(
      f"config.{field}: {path} is not a valid MNIST file ({what}); replace it"
      f" with the original or delete it")


def _read_idx(path: str, magic: int, field: str) -> np.ndarray:
  """Parses an IDX file (big-endian int32 header, then uint8 data)."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
    raise _corrupt(path, field, " ".join(str(e).split())) from None
  # Images: magic, count, rows, cols; labels: magic, count.
  header_ints = 4 if magic == _IMAGES_MAGIC else 2
  if len(data) < 4 * header_ints:
    raise _corrupt(path, field, f"{len(data)} bytes, shorter than the header")
  header = np.frombuffer(data, ">i4", count=header_ints)
  if header[0] != magic:
    raise _corrupt(path, field, f"magic {header[0]}, expected {magic}")
  shape = tuple(int(n) for n in header[1:])
  if magic == _IMAGES_MAGIC and shape[1:] != (_ROWS, _COLS):
    raise _corrupt(path, field,
                   f"images of {shape[1]}x{shape[2]}, expected 28x28")
  size = int(np.prod(shape))
  if len(data) != 4 * header_ints + size:
    raise _corrupt(path, field, f"{len(data) - 4 * header_ints} data bytes,"
                   f" the header promises {size}")
  return np.frombuffer(data, np.uint8, offset=4 * header_ints).reshape(shape)


def _read_npz(path: str, name: str, field: str):
  suffix = SPLITS[name][1]
  try:
    with np.load(path, allow_pickle=False) as npz:
      images, labels = npz[f"x_{suffix}"], npz[f"y_{suffix}"]
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    raise _corrupt(path, field, " ".join(str(e).split())) from None
  if (images.dtype != np.uint8 or images.shape[1:] != (_ROWS, _COLS) or
      labels.shape != images.shape[:1]):
    raise _corrupt(path, field, f"x_{suffix} {images.dtype}{images.shape},"
                   f" y_{suffix} {labels.shape}")
  return images, labels.astype(np.uint8)
