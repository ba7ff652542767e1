"""Tests of experiments/tfrecord_images.py: finding, parsing, training.

Run::

    PYTHONPATH=. python -m pytest -q tests/unit/experiments/test_tfrecord_images.py

The shards are written here in the codelab's format (TFRecord files of
tf.train.Examples with 'image' JPEG bytes and int64 'class', named like
flowers00-40.tfrec), holding generated images whose class is the colour
and direction of their stripes. The reference pixels are the generated
arrays; JPEG is lossy, so they are compared with a tolerance.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from experiments import tfrecord_images
from looper import config as lc
from looper import run
from looper.data import shards
from tests.fixtures.configs import configured

FILES, PER_FILE, SIZE = 10, 40, 32
# Class = 2 * direction + colour: red or blue stripes, across or down.
COLOURS = np.array([[220, 40, 40], [40, 40, 220]])


def _images(rng, labels):
  """uint8 [N, 32, 32, 3]: stripes 4 pixels wide at a random phase, noisy."""
  rows = np.arange(SIZE)
  images = np.empty((len(labels), SIZE, SIZE, 3), np.uint8)
  for i, label in enumerate(labels):
    on = ((rows + rng.integers(8)) // 4) % 2 == 1
    mask = on[:, None] if label // 2 == 0 else on[None, :]  # across / down
    image = np.where(np.broadcast_to(mask, (SIZE, SIZE))[..., None],
                     COLOURS[label % 2], 120.0)
    images[i] = np.clip(image + rng.normal(0, 12, image.shape), 0, 255)
  return images


def _example(image, label, index):
  jpeg = tf.io.encode_jpeg(image, quality=95, chroma_downsampling=False)
  feature = {
      "image": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[jpeg.numpy()])),
      "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
      # Kaggle's files also carry an id: extra features are ignored.
      "id": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[b"%05d" % index]))}
  return tf.train.Example(
      features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path, images, labels, first=0):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i, (image, label) in enumerate(zip(images, labels)):
      writer.write(_example(image, int(label), first + i))


@pytest.fixture(scope="module")
def flowers(tmp_path_factory):
  """(folder of flowers00-40.tfrec .. flowers09-40.tfrec, images, labels)."""
  root = tmp_path_factory.mktemp("flowers")
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 4, FILES * PER_FILE)
  images = _images(rng, labels)
  for f in range(FILES):
    part = slice(f * PER_FILE, (f + 1) * PER_FILE)
    _write(root / f"flowers{f:02d}-{PER_FILE}.tfrec", images[part],
           labels[part], first=part.start)
  return root, images, labels


def _config(data_dir, **model):
  return configured(tfrecord_images.get_config(), {
      "data.dir": str(data_dir), "model.image_size": 16,
      **{f"model.{k}": v for k, v in model.items()}})


def _examples(files):
  n = files.size
  images, labels = next(iter(files.examples().batch(n)))
  return images.numpy(), labels.numpy()


def _halved(images):
  """What bilinear resizing 32 -> 16 computes: the mean of each 2x2 block."""
  return images.reshape(-1, 16, 2, 16, 2, 3).mean(axis=(2, 4)) / 255


def test_get_config_validates():
  c = tfrecord_images.get_config()
  lc.validate(c)
  assert c.model_fn is tfrecord_images.model_fn
  model = tfrecord_images.model_fn(c)
  assert model.input_shape == (None, 192, 192, 3)
  assert model.output_shape == (None, 5) and model.output.dtype == "float32"
  norms = [l for l in model.layers if l.__class__.__name__ ==
           "BatchNormalization"]
  assert len(norms) == 4 and all(l.synchronized for l in norms)
  for field, value, low in (("num_classes", 1, 2), ("image_size", 15, 16),
                            ("width", 0, 1)):
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(configured(tfrecord_images.get_config(),
                             {f"model.{field}": value}))
    assert str(e.value) == (f"config.model.{field}={value}: must be a whole"
                            f" number >= {low}; set --config.model.{field}")
  # 16 pixels: the four 2x2 poolings leave one.
  smallest = configured(tfrecord_images.get_config(), {"model.image_size": 16})
  lc.validate(smallest)
  assert tfrecord_images.model_fn(smallest).output_shape == (None, 5)


def test_parses_and_resizes_the_records(flowers):
  root, images, labels = flowers
  files = tfrecord_images.dataset_fn(_config(root), "flowers[7:]")
  assert isinstance(files, shards.Files)
  assert [p.split("/")[-1] for p in files.paths] == [
      "flowers07-40.tfrec", "flowers08-40.tfrec", "flowers09-40.tfrec"]
  assert files.counts == [PER_FILE] * 3 and files.size == 3 * PER_FILE
  got, got_labels = _examples(files)
  assert got.shape == (120, 16, 16, 3) and got.dtype == np.float32
  np.testing.assert_array_equal(got_labels, labels[280:])  # files' order
  want = _halved(images[280:].astype(np.float64))
  error = np.abs(got - want).mean(axis=(1, 2, 3))
  # Against another image's pixels the error is ~0.2: JPEG's is far below.
  assert error.max() < 0.03, error.max()
  assert np.abs(got - np.roll(want, 1, axis=0)).mean() > 0.1
  # The counts are kept beside the files for the next run.
  index = json.loads((root / "index.json").read_text())
  assert dict(index["files"])["flowers09-40.tfrec"] == PER_FILE


def test_split_folders_and_percent_slices(flowers, tmp_path):
  root, images, labels = flowers
  for split in ("train", "val"):
    (tmp_path / split).mkdir()
  for f in range(4):
    part = slice(f * 10, (f + 1) * 10)
    _write(tmp_path / "train" / f"{f:02d}-32x32-10.tfrec", images[part],
           labels[part])
  _write(tmp_path / "val" / "00-32x32-10.tfrec", images[40:50], labels[40:50])
  c = _config(tmp_path)
  c.data.train_split, c.data.eval_split = "train[50%:]", "val"
  files = tfrecord_images.dataset_fn(c, "train[50%:]")
  assert len(files.paths) == 2
  np.testing.assert_array_equal(_examples(files)[1], labels[20:40])
  np.testing.assert_array_equal(
      _examples(tfrecord_images.dataset_fn(c, "val"))[1], labels[40:50])


def test_missing_files_name_the_dir(tmp_path):
  c = _config(tmp_path)
  with pytest.raises(lc.ConfigError) as e:
    tfrecord_images.dataset_fn(c, "flowers[4:]")
  message = str(e.value)
  assert "\n" not in message
  assert "config.data.dir" in message and str(tmp_path) in message
  assert f"{tmp_path}/flowers*.tfrec" in message
  assert "config.data.train_split='flowers[4:]'" in message
  with pytest.raises(lc.ConfigError, match=r"config\.data\.dir is not set"):
    tfrecord_images.dataset_fn(_config(""), "flowers")


def test_files_of_another_format(flowers, tmp_path):
  root, _, _ = flowers
  c = _config(tmp_path)
  # A cut copy: its first record parses, counting the rest fails.
  whole = (root / "flowers00-40.tfrec").read_bytes()
  (tmp_path / "cut00.tfrec").write_bytes(whole[:len(whole) // 2])
  with pytest.raises(lc.ConfigError, match="truncated record") as e:
    tfrecord_images.dataset_fn(c, "cut")
  assert "\n" not in str(e.value) and "{{" not in str(e.value)
  assert f"reading {tmp_path}/cut00.tfrec failed" in str(e.value)

  with tf.io.TFRecordWriter(str(tmp_path / "other00.tfrec")) as writer:
    writer.write(tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[b"jpeg"]))})).SerializeToString())
  with pytest.raises(lc.ConfigError) as e:
    tfrecord_images.dataset_fn(c, "other")
  message = str(e.value)
  assert "\n" not in message and "other00.tfrec" in message
  assert "'class' (int64)" in message
  (tmp_path / "junk00.tfrec").write_bytes(b"<html>not a record</html>" * 9)
  with pytest.raises(lc.ConfigError) as e:
    tfrecord_images.dataset_fn(c, "junk")
  assert "\n" not in str(e.value) and "junk00.tfrec" in str(e.value)


@pytest.mark.slow  # trains or compiles for seconds
def test_trains_end_to_end(flowers, tmp_path):
  root, _, _ = flowers
  c = _config(root, width=8, num_classes=4, dropout=0.1)
  c.data.train_split, c.data.eval_split = "flowers[2:]", "flowers[:2]"
  c.train.steps, c.train.batch_size, c.train.steps_per_loop = 40, 32, 40
  c.eval.every_steps, c.eval.batch_size = 0, 40
  c.checkpoint.every_steps = 0
  c.optimizer.learning_rate = 3e-3
  result = run.run(c, str(tmp_path), mode="train_and_eval")
  assert result["step"] == 40
  assert result["eval"]["examples"] == 2 * PER_FILE
  # Chance is 0.25.
  assert result["eval"]["accuracy"] >= 0.6, result["eval"]


@pytest.mark.slow  # trains or compiles for seconds
def test_ready_for_a_tpu(flowers):
  """`looper check` passes the shipped config (16-pixel images: same ops)."""
  from looper.cli import tpu_check  # pylint: disable=g-import-not-at-top
  root, _, _ = flowers
  c = _config(root, width=4)
  # The shipped data.virtual_shards=8 needs 8 train files: 2 of the 10
  # evaluate.
  c.data.train_split, c.data.eval_split = "flowers[2:]", "flowers[:2]"
  assert tpu_check.check(c, cores=8) == []
  c.data.train_split = "flowers[4:]"  # 6 files for 8 groups
  problems = tpu_check.check(c, cores=8)
  assert len(problems) == 1 and "data.virtual_shards" in problems[0], problems
