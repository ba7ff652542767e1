"""Flowers from TFRecord shards of JPEGs: the TPU codelab's recipe, file mode.

Synopsis::

    # The codelab's 3670 flowers in 5 classes, 16 files of 192x192 JPEGs
    # (flowers00-230.tfrec .. flowers15-220.tfrec); files 4-15 train, 0-3
    # evaluate. data.dir may also be the gs:// folder itself where
    # TensorFlow reads Cloud Storage (a Cloud TPU VM).
    gcloud storage cp -r \
        gs://flowers-public/tfrecords-jpeg-192x192-2 /data/flowers
    python -m looper.main --config=experiments/tfrecord_images.py \
        --workdir=/tmp/flowers --config.data.dir=/data/flowers

    # Kaggle's "Petals to the Metal" (104 classes; train/ and val/ folders
    # of 16 files each, same record format).
    kaggle competitions download -c tpu-getting-started -p /data/petals
    unzip -q /data/petals/tpu-getting-started.zip -d /data/petals
    python -m looper.main --config=experiments/tfrecord_images.py \
        --workdir=/tmp/petals \
        --config.data.dir=/data/petals/tfrecords-jpeg-192x192 \
        --config.data.train_split=train --config.data.eval_split=val \
        --config.model.num_classes=104 --config.data.virtual_shards=16

    # From Python:
    from experiments import tfrecord_images
    config = tfrecord_images.get_config()
    config.data.dir = "/data/flowers"
    files = tfrecord_images.dataset_fn(config, "flowers[4:]")  # shards.Files
    image, label = next(iter(files.examples()))

Records are tf.train.Examples with features 'image' (the JPEG's bytes) and
'class' (int64 class id); any others ('id', 'one_hot_class', ...) are
ignored. A split is a folder of .tfrec files, `data.dir/<name>/*.tfrec`,
or else the files whose names start with it, `data.dir/<name>*.tfrec`,
with an optional slice over the sorted FILES (not examples):
'flowers[4:]' is every file but the first four.

dataset_fn returns `looper.data.shards.Files`: file mode, where each input
pipeline opens only its own files (the files are dealt into
`data.virtual_shards` fixed groups, so the loss curve does not depend on
the replica count; see looper/data/shards.py). Record counts are read once and
kept in `index.json` beside the files (recounted each run if that folder
is read-only). Each record is decoded and resized to
`model.image_size` as it is read.
"""

import functools
import os
import re

import keras
import ml_collections
import tensorflow as tf

from experiments import common
from looper import config as lc
from looper.data import shards
from looper.train import layers

# What each record holds (the codelab's and Kaggle's names).
FEATURES = {"image": tf.io.FixedLenFeature([], tf.string),
            "class": tf.io.FixedLenFeature([], tf.int64)}
EXTENSION = ".tfrec"
STAGES = 4  # conv blocks, each halving the image (192 -> 12 pixels)


def get_config() -> ml_collections.ConfigDict:
  """Returns the config of a ~45-epoch run on the codelab's 5 flowers."""
  # 12 files of 230 images train: ~22 steps of 128 per epoch.
  c = common.config(model_fn, dataset_fn, steps=1000, batch_size=128,
                    steps_per_loop=50, eval_every=250, eval_batch_size=128,
                    optimizer="adam", learning_rate=1e-3, schedule="cosine")

  # The folder holding the .tfrec files (or one folder per split); no
  # download: see the module doc for where the files come from.
  c.data.dir = ""
  # The codelab's split is by files: the first ones evaluate.
  c.data.train_split = "flowers[4:]"
  c.data.eval_split = "flowers[:4]"
  # Groups of files a global batch draws on equally: at most the number of
  # train files, a divisor of train.batch_size and a multiple of the
  # replica count (8 fits 12 files, 1-8 replicas, a TPU v3-8).
  c.data.virtual_shards = 8

  # Images are resized to image_size x image_size as they are read; each
  # of the STAGES blocks halves them, so at least 2**STAGES pixels.
  c.model.image_size = lc.whole(192, low=2**STAGES)
  c.model.num_classes = lc.whole(5, low=2)
  # Filters of the first conv block; each next block has twice as many.
  c.model.width = lc.whole(32)
  # Dropout before the logits (0: none).
  c.model.dropout = 0.2
  return c


def model_fn(config: ml_collections.ConfigDict) -> keras.Model:
  """Returns a small CNN mapping images to `model.num_classes` logits.

  STAGES blocks of conv 3x3 + batch norm + ReLU + 2x2 max-pool with
  `model.width`, 2x, 4x, ... filters, then global average pooling and one
  dense layer.

  Args:
    config: reads `model.image_size`, `model.num_classes`, `model.width`
      and `model.dropout` (`lc.validate` checks the declared sizes).
  """
  image_size, classes = config.model.image_size, config.model.num_classes
  inputs = keras.Input(shape=(image_size, image_size, 3), name="images")
  x = inputs
  for stage in range(STAGES):
    x = keras.layers.Conv2D(config.model.width * 2**stage, 3, padding="same",
                            use_bias=False)(x)
    # synchronized: global-batch statistics, the same on any replica count
    # (see experiments/cifar10.py for what that costs with jit_compile).
    # momentum 0.9: short runs' moving averages forget their start values.
    x = keras.layers.BatchNormalization(synchronized=True, momentum=0.9)(x)
    x = keras.layers.MaxPooling2D()(keras.layers.ReLU()(x))
  x = keras.layers.GlobalAveragePooling2D()(x)
  if config.model.get("dropout"):  # looper's: same masks on any replica count
    x = layers.Dropout(config.model.dropout, seed=config.seed)(x)
  # float32 even under a mixed_float16 policy: the loss and softmax need it.
  logits = keras.layers.Dense(classes, dtype="float32", name="logits")(x)
  return keras.Model(inputs, logits, name="flowers_cnn")


def dataset_fn(config: ml_collections.ConfigDict, split: str) -> shards.Files:
  """Returns the `split` files for looper's file mode.

  Args:
    config: reads `data.dir`, `model.image_size` and, to name the field in
      errors, `data.train_split`.
    split: a folder or file-name prefix under data.dir with an optional
      slice over its sorted files: 'train', 'flowers[4:]', 'val[:50%]'.

  Returns:
    `shards.Files` whose examples are (image, label): float32
    [image_size, image_size, 3] in [0, 1], int32 scalar.

  Raises:
    ConfigError: data.dir unset or without the split's files; files that
      are not TFRecords of flowers-format examples.
  """
  field = lc.split_field(config, split)
  name, _, _ = lc.parse_split(split, field)
  paths = find_files(config.data.dir, name, f"config.{field}={split!r}")
  _, selected = lc.split_slice(split, len(paths), field=field)
  paths = paths[selected]
  parse = functools.partial(parse_example, image_size=config.model.image_size)
  _check_first_record(paths[0], parse)
  try:  # counts the records once if index.json does not list the files
    return shards.Files(paths, parse=parse, split=split)
  except tf.errors.OpError as e:
    raise lc.ConfigError(
        f"config.data.dir: reading {_first_broken(paths)} failed"
        f" ({_reason(e)}); replace it with its original") from None


def find_files(directory: str, name: str, wanted_by: str) -> list[str]:
  """The sorted .tfrec files of split `name`: a folder, or a name prefix.

  Args:
    directory: config.data.dir (a local path or a gs:// folder).
    name: the split's name without its slice.
    wanted_by: the split's field and value, for the error.

  Raises:
    ConfigError: no directory set, or no files found.
  """
  if not directory:
    raise lc.ConfigError(
        f"config.data.dir is not set; point --config.data.dir at the folder"
        f" of {EXTENSION} files (see experiments/tfrecord_images.py for where"
        f" to get them)")
  if "://" not in directory:  # gs://, s3://: as they are
    directory = os.path.abspath(os.path.expanduser(directory))
  patterns = [os.path.join(directory, name, "*" + EXTENSION),
              os.path.join(directory, name + "*" + EXTENSION)]
  for pattern in patterns:
    paths = sorted(tf.io.gfile.glob(pattern))
    if paths:
      return paths
  raise lc.ConfigError(
      f"config.data.dir={directory!r} has no TFRecord files for {wanted_by}:"
      f" expected {patterns[0]} or {patterns[1]}; point --config.data.dir"
      f" at the folder holding them")


def parse_example(record: tf.Tensor, image_size: int):
  """One serialized tf.train.Example -> (image, label), in a tf.data map."""
  example = tf.io.parse_single_example(record, FEATURES)
  image = tf.io.decode_jpeg(example["image"], channels=3)
  # Bilinear, to a square: the recipe's files are square crops already.
  image = tf.image.resize(image, (image_size, image_size)) / 255.0
  return image, tf.cast(example["class"], tf.int32)


def _check_first_record(path: str, parse) -> None:
  """Parses one record now: a wrong format fails here in one line, not as a
  tf.data error in the middle of training."""
  try:
    for record in tf.data.TFRecordDataset(path).take(1):
      parse(record)
  except tf.errors.OpError as e:
    raise lc.ConfigError(
        f"config.data.dir: {path} is not a TFRecord file of flowers-format"
        f" tf.train.Examples ({_reason(e)}); each record needs"
        f" 'image' (JPEG bytes) and 'class' (int64)") from None


def _first_broken(paths: list[str]) -> str:
  """The first file whose records cannot all be read (after an error)."""
  for path in paths:
    try:
      shards.count_records([path])
    except tf.errors.OpError:
      return path
  return f"the {len(paths)} files"  # the error came and went


def _reason(e: tf.errors.OpError) -> str:
  """A TensorFlow error's own words, without the op and function names."""
  text = re.sub(r"\{\{.*?\}\}|\[Op:.*", "", lc.first_line(e))
  return " ".join(text.split())
