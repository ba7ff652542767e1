"""CIFAR-10 with a ResNet-20 and random crop + flip augmentation.

Synopsis::

    # Full CIFAR-10: read from ~/.cache/looper/cifar10, downloaded there once
    # (the 170 MB python-pickle archive Keras uses, checked by its sha256).
    python -m looper.main --config=experiments/cifar10.py --workdir=/tmp/cifar10

    # Offline: a folder holding cifar-10-batches-py/ (or its files).
    python -m looper.main --config=experiments/cifar10.py \
        --workdir=/tmp/cifar10 --config.data.dir=/data/cifar10

    # Hold out the last 5000 training images instead of using the test set.
    python -m looper.main --config=experiments/cifar10.py \
        --workdir=/tmp/cifar10 --config.data.train_split='train[:90%]' \
        --config.data.eval_split='train[90%:]'

    # From Python (a notebook, a test):
    from experiments import cifar10
    config = cifar10.get_config()
    model = cifar10.model_fn(config)                 # logits, not softmax
    dataset = cifar10.dataset_fn(config, "test")     # (image, label)

Where the files come from: `config.data.dir` if it is set (never a
download), else `config.data.cache_dir`, which is filled from
`config.data.url` the first time (see looper/data/datasets.py). The files are
the original python pickles `data_batch_1` .. `data_batch_5` (train, 10,000
images each) and `test_batch` (test), each a dict whose b'data' is uint8
[N, 3072]: per image the 1024 red, then green, then blue pixels, rows first.

Augmentation (train split only): each image is zero-padded by 4 pixels and
a random 32x32 crop of it taken, flipped left-right half the time; see
`augment` for how it stays exact under resume and any replica count.
"""

import os
import pickle

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from experiments import common
from looper import config as lc
from looper.data import datasets
from looper.train import layers

DEFAULT_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
# keras.datasets.cifar10's published sha256 of that archive.
DEFAULT_HASH = (
    "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce")
DEFAULT_CACHE_DIR = "~/.cache/looper/cifar10"
# Split name -> its pickle files, in the order their images are read.
SPLITS = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)),
          "test": ("test_batch",)}
NUM_CLASSES = 10
SIZE = 32
PAD = 4  # pixels of zero padding around an image before the random crop
# Per-channel mean and standard deviation of the 50,000 training images
# (the values the CIFAR ResNet recipes normalise with).
MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], np.float32)
# What a CIFAR pickle may reference: rebuilding its numpy array and nothing
# else, so a tampered file cannot run code (keras.datasets refuses the rest
# too). numpy < 2 wrote numpy.core, numpy >= 2 writes numpy._core; Python 3
# writes bytes at pickle protocol 2 as _codecs.encode(text, 'latin1'), which
# only encodes a string (PyTorch's weights-only unpickler allows it too).
_PICKLE_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("_codecs", "encode")})


def get_config() -> ml_collections.ConfigDict:
  """Returns the config of a 100-epoch ResNet-20 run: 39,000 steps of 128."""
  # 390 steps of 128 are one pass over the 50,000 training images; 10,000
  # test images are exactly 25 batches of 400 (no padded batch; splits over
  # 8 TPU cores). He et al.'s recipe (SGD, momentum 0.9, rate 0.1 at batch
  # 128), with a cosine decay to 0 in place of their two steps.
  c = common.config(model_fn, dataset_fn, steps=39_000, batch_size=128,
                    steps_per_loop=390, eval_every=3900, eval_batch_size=400,
                    optimizer="sgd", learning_rate=0.1, schedule="cosine")
  c.optimizer.momentum = 0.9
  c.optimizer.warmup_steps = 390

  # CIFAR-10 has only 'train' (50,000) and 'test' (10,000); slice them to
  # hold out data, e.g. 'train[:90%]' and 'train[90%:]'.
  c.data.train_split = "train"
  c.data.eval_split = "test"
  # Differently augmented copies of the train split in one pass of
  # dataset_fn (0: no augmentation); see `augment`. 100, the epochs that
  # train.steps makes: every epoch sees each image in a fresh crop.
  c.data.augment_epochs = lc.whole(100, low=0)
  # Where the archive keras.datasets.cifar10 downloads (checked against its
  # published sha256) is extracted and looked for when data.dir is empty.
  datasets.add_fields(c, cache_dir=DEFAULT_CACHE_DIR, url=DEFAULT_URL,
                      file_hash=DEFAULT_HASH)

  # Filters of the first stage; the second and third have 2x and 4x. With
  # blocks=3 this is ResNet-20 (6 * blocks + 2 layers, He et al. 2016 4.2).
  c.model.width = lc.whole(16)
  c.model.blocks = lc.whole(3)
  # SGD-style weight decay of every conv and dense kernel (0: none): an L2
  # penalty of weight_decay / 2 * w^2, whose gradient is weight_decay * w.
  c.model.weight_decay = 5e-4
  # Dropout before the logits (0: none, as in the paper).
  c.model.dropout = 0.0
  return c


def model_fn(config: ml_collections.ConfigDict) -> keras.Model:
  """Returns a CIFAR ResNet mapping images to 10 logits (no softmax).

  Three stages of `model.blocks` basic residual blocks of `model.width`,
  2x and 4x filters (stride 2 entering the last two, with a 1x1 projection
  shortcut), global average pooling and one dense layer.

  Args:
    config: reads `model.width`, `model.blocks`, `model.weight_decay` and
      `model.dropout` (`lc.validate` checks the declared sizes).
  """
  decay = config.model.get("weight_decay")
  regularizer = keras.regularizers.L2(decay / 2) if decay else None
  conv = lambda filters, size, strides=1: keras.layers.Conv2D(
      filters, size, strides=strides, padding="same", use_bias=False,
      kernel_initializer="he_normal", kernel_regularizer=regularizer)

  inputs = keras.Input(shape=(SIZE, SIZE, 3), name="images")
  x = keras.layers.ReLU()(_batch_norm()(conv(config.model.width, 3)(inputs)))
  for stage in range(3):
    filters = config.model.width * 2**stage
    for block in range(config.model.blocks):
      strides = 2 if stage and not block else 1
      shortcut = x
      if strides != 1:
        shortcut = _batch_norm()(conv(filters, 1, strides)(x))
      x = keras.layers.ReLU()(_batch_norm()(conv(filters, 3, strides)(x)))
      x = _batch_norm()(conv(filters, 3)(x))
      x = keras.layers.ReLU()(keras.layers.Add()([x, shortcut]))
  x = keras.layers.GlobalAveragePooling2D()(x)
  if config.model.get("dropout"):  # looper's: same masks on any replica count
    x = layers.Dropout(config.model.dropout, seed=config.seed)(x)
  # float32 even under a mixed_float16 policy: the loss and softmax need it.
  logits = keras.layers.Dense(NUM_CLASSES, dtype="float32", name="logits",
                              kernel_regularizer=regularizer)(x)
  return keras.Model(inputs, logits, name="cifar_resnet")


def _batch_norm() -> keras.layers.Layer:
  # synchronized: statistics of the GLOBAL batch (summed over replicas), so
  # the loss curve does not change with the replica count; a replica's own
  # batch would give 2 replicas other statistics than 1. Micro-batches of
  # train.grad_accum_steps still normalise alone (BN's nature). Its
  # all-reduce runs inside the step, which TensorFlow refuses to compile
  # with train.jit_compile=True on several CPU/GPU replicas (one is fine).
  # momentum 0.9: the moving averages forget their initial values within a
  # few hundred steps, so short runs evaluate well too.
  return keras.layers.BatchNormalization(synchronized=True, momentum=0.9)


def dataset_fn(config: ml_collections.ConfigDict,
               split: str) -> tf.data.Dataset:
  """Returns the `split` examples, unbatched, in the files' order.

  Args:
    config: reads `data.dir`, `data.cache_dir`, `data.url`,
      `data.file_hash`, `data.augment_epochs`, `seed`, and which split is
      the train split (`data.train_split`, `data.eval_split`).
    split: 'train' or 'test' with an optional slice: 'train[:90%]',
      'test[:1000]'.

  Returns:
    A dataset of (image, label): float32 [32, 32, 3] normalised per channel
    with MEAN and STD, int32 scalar. The train split holds
    `data.augment_epochs` augmented copies of its images (see `augment`).
    The framework shuffles, batches and shards it.

  Raises:
    ConfigError: a bad split, missing or corrupt files, a failed download.
  """
  field, name = common.split_name(config, split, SPLITS, dataset="CIFAR-10",
                                  sliced="train[:90%]")
  epochs = config.data.get("augment_epochs", 0)
  images, labels = load_cifar10(name, config.data)
  _, selected = lc.split_slice(split, len(labels), field=field)
  # Kept uint8 until the last map: a quarter of the memory of float32.
  dataset = tf.data.Dataset.from_tensor_slices(
      (images[selected], labels[selected]))
  # dataset_fn sees a split's name, not what looper reads it for: when one
  # split is both trained and evaluated on, the eval must see plain images,
  # so it is not augmented at all.
  if (epochs and split == config.data.train_split and
      split != config.data.eval_split):
    dataset = augment(dataset, seed=config.seed, epochs=epochs)
  return dataset.map(_normalized, num_parallel_calls=tf.data.AUTOTUNE)


def augment(dataset: tf.data.Dataset, *, seed: int,
            epochs: int) -> tf.data.Dataset:
  """`epochs` copies of `dataset`, each image randomly cropped and flipped.

  Why copies: looper calls dataset_fn for ONE pass in a fixed order and
  shuffles, shards and batches after it, and nothing tells dataset_fn which
  epoch it is reading. Random ops keyed by a stateful generator (or
  Dataset.random(rerandomize_each_iteration=True)) would count passes from
  the start of each process, so a resumed run would crop differently from
  an uninterrupted one. Keying the randomness by the example's index alone
  would give the same crop every epoch: a fixed distortion, not
  augmentation. So one pass holds `epochs` copies, and example i of that
  pass (copy i // N of image i % N) is cropped and flipped by stateless ops
  seeded with (seed, i): a function of the config alone, so every pipeline,
  replica count and resumed run sees the same images, and an image looks
  different in each copy. The price: looper's epoch spans all the copies,
  and a resumed run skips from the start of that epoch to its position,
  reading (not training on) the images in between: up to `epochs` times
  the 50,000 of one pass, at ~10,000 images/s on 2 CPU cores. Lower
  `data.augment_epochs` for faster resumes, at the cost of fewer distinct
  crops (copies repeat after that many epochs).

  Args:
    dataset: (uint8 image [32, 32, 3], label) examples.
    seed: config.seed.
    epochs: copies, each cropped and flipped anew.
  """
  seed = tf.constant(seed, tf.int64)

  def crop_and_flip(i, example):
    image, label = example
    crop_seed, flip_seed = tf.unstack(
        tf.random.experimental.stateless_split(tf.stack([seed, i]), 2))
    padded = tf.pad(image, [[PAD, PAD], [PAD, PAD], [0, 0]])
    image = tf.image.stateless_random_crop(padded, (SIZE, SIZE, 3), crop_seed)
    return tf.image.stateless_random_flip_left_right(image, flip_seed), label

  return dataset.repeat(epochs).enumerate().map(
      crop_and_flip, num_parallel_calls=tf.data.AUTOTUNE)


def _normalized(image, label):
  image = (tf.cast(image, tf.float32) / 255.0 - MEAN) / STD
  return image, tf.cast(label, tf.int32)


def load_cifar10(name: str, data: ml_collections.ConfigDict):
  """Split `name` ('train' or 'test', no slice) of the pickles `data` points
  at (see `common.locate`) as (images uint8 [N, 32, 32, 3], labels uint8
  [N]); a ConfigError for an unknown name, missing, corrupt or incomplete
  files, or a failed download."""
  files = SPLITS.get(name, ("?",))  # an unknown name: common.locate says so
  expected = (f"{files[0]}..{files[-1][-1]}" if len(files) > 1 else files[0])
  return common.locate(data, name, SPLITS, _load_from, dataset="CIFAR-10",
                       expected=f"{expected} (in cifar-10-batches-py/)",
                       extract=True)


def _load_from(directory: str, name: str, field: str):
  """Returns (images, labels) from `directory`, or None if it has no files."""
  paths = [os.path.join(directory, f) for f in SPLITS[name]]
  present = [p for p in paths if os.path.isfile(p)]
  if not present:
    return None
  if len(present) < len(paths):
    missing = [os.path.basename(p) for p in paths if p not in present]
    raise lc.ConfigError(
        f"config.{field}: {directory} has {len(present)} of the CIFAR-10"
        f" {name} files but not {', '.join(missing)}; extract the whole"
        f" cifar-10-python.tar.gz there")
  batches = [_read_batch(p, field) for p in paths]
  return (np.concatenate([images for images, _ in batches]),
          np.concatenate([labels for _, labels in batches]))


class _Unpickler(pickle.Unpickler):
  """Rebuilds numpy arrays and builtins only (see _PICKLE_GLOBALS)."""

  def find_class(self, module, name):
    if (module, name) in _PICKLE_GLOBALS:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f"it references {module}.{name}")


def _corrupt(path: str, field: str, what: str) -> lc.ConfigError:
  return lc.ConfigError(
      f"config.{field}: {path} is not a valid CIFAR-10 batch ({what});"
      f" replace it with the original or delete it")


def _read_batch(path: str, field: str):
  """Parses one pickled batch into (images [N, 32, 32, 3], labels [N])."""
  try:
    with open(path, "rb") as f:
      # The files were pickled by Python 2: its str keys load as bytes.
      batch = _Unpickler(f, encoding="bytes").load()
  except Exception as e:  # pylint: disable=broad-except
    # Unpickling junk raises any of a dozen types (EOFError, KeyError, ...).
    raise _corrupt(path, field, lc.first_line(e)) from None
  if not isinstance(batch, dict):
    raise _corrupt(path, field, f"a {type(batch).__name__}, not a dict")
  pixels, labels = batch.get(b"data"), batch.get(b"labels")
  if (not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or
      pixels.ndim != 2 or pixels.shape[1] != 3 * SIZE * SIZE):
    what = (f"data {pixels.dtype}{pixels.shape}"
            if isinstance(pixels, np.ndarray) else "no b'data' array")
    raise _corrupt(path, field, f"{what}, expected uint8 [N, 3072]")
  if not (isinstance(labels, list) and len(labels) == len(pixels) and
          all(isinstance(l, (int, np.integer)) and 0 <= l < NUM_CLASSES
              for l in labels)):
    raise _corrupt(path, field, f"expected a b'labels' list of {len(pixels)}"
                   f" class ids in [0, {NUM_CLASSES})")
  # Each row is three 32x32 planes (R, G, B): to [N, 32, 32, 3] (HWC).
  images = pixels.reshape(-1, 3, SIZE, SIZE).transpose(0, 2, 3, 1)
  return np.ascontiguousarray(images), np.array(labels, np.uint8)
