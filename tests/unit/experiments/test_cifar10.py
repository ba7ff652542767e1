"""Tests of experiments/cifar10.py: the pickle loader, augmentation, training.

Run::

    cd /work/main && PYTHONPATH=. python -m pytest -q tests/unit/experiments/test_cifar10.py

The data is written here in CIFAR-10's real on-disk layout
(`cifar-10-batches-py/data_batch_1..5`, `test_batch`: pickled dicts of
uint8 [N, 3072] CHW rows), with class-coloured noisy images so a small
ResNet learns them. The references are the generated arrays themselves.
Nothing leaves the machine: the only URLs are on 127.0.0.1.
"""

import hashlib
import pickle
import tarfile

from keras.src.datasets import cifar10 as keras_cifar10
import numpy as np
import pytest

from experiments import cifar10
from looper import config as lc
from looper import run
from tests.fixtures.configs import configured
from tests.fixtures.servers import loopback_server
from tests.unit.experiments.test_mnist import keras_download

# Port 9 (discard) on loopback: nothing listens, the connection is refused.
DEAD_URL = "http://127.0.0.1:9/cifar-10-python.tar.gz"
PER_BATCH, TEST = 64, 200  # 5 x 64 = 320 train images, 200 test images
# A colour per class (RGB), far apart; the images are noise around it.
PALETTE = np.array([[230, 25, 25], [25, 230, 25], [25, 25, 230],
                    [230, 230, 25], [230, 25, 230], [25, 230, 230],
                    [128, 128, 128], [250, 150, 50], [100, 40, 160],
                    [240, 240, 240]])


def _images(rng, labels):
  """uint8 [N, 32, 32, 3]: each pixel its class colour + Gaussian noise."""
  noise = rng.normal(0, 45, size=(len(labels), 32, 32, 3))
  return np.clip(PALETTE[labels][:, None, None, :] + noise, 0,
                 255).astype(np.uint8)


def _write_batch(path, images, labels, name):
  # The originals' layout: per image the R, G, B planes, each row-major.
  rows = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
  batch = {b"batch_label": name, b"labels": [int(l) for l in labels],
           b"data": rows, b"filenames": [b"img_%05d.png" % i
                                         for i in range(len(images))]}
  with open(path, "wb") as f:
    pickle.dump(batch, f, protocol=2)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
  """(root holding cifar-10-batches-py/, {split: (images, labels)})."""
  root = tmp_path_factory.mktemp("cifar")
  folder = root / "cifar-10-batches-py"
  folder.mkdir()
  rng = np.random.default_rng(0)
  arrays = {}
  labels = rng.integers(0, 10, 5 * PER_BATCH)
  images = _images(rng, labels)
  for i in range(5):
    part = slice(i * PER_BATCH, (i + 1) * PER_BATCH)
    _write_batch(folder / f"data_batch_{i + 1}", images[part], labels[part],
                 b"training batch %d of 5" % (i + 1))
  arrays["train"] = images, labels
  labels = rng.integers(0, 10, TEST)
  images = _images(rng, labels)
  _write_batch(folder / "test_batch", images, labels, b"testing batch 1 of 1")
  arrays["test"] = images, labels
  return root, arrays


def _config(data_dir, **fields):
  return configured(cifar10.get_config(), data__dir=str(data_dir), **fields)


def _as_arrays(dataset):
  # One batch of exactly the dataset's size (a larger one costs its memory).
  images, labels = next(iter(dataset.batch(int(dataset.cardinality()))))
  return images.numpy(), labels.numpy()


def _pixels(images):
  """The uint8 pixels back from dataset_fn's normalised float images."""
  return np.round((images * cifar10.STD + cifar10.MEAN) * 255).astype(np.uint8)


def test_get_config_validates_and_downloads_what_keras_checks(monkeypatch):
  c = cifar10.get_config()
  lc.validate(c)
  assert (c.data.url, c.data.file_hash) == keras_download(monkeypatch,
                                                          keras_cifar10)
  for field, value, low in (("model.blocks", 0, 1), ("model.width", -2, 1),
                            ("data.augment_epochs", -1, 0)):
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(configured(cifar10.get_config(), {field: value}))
    assert str(e.value) == (f"config.{field}={value}: must be a whole number"
                            f" >= {low}; set --config.{field}")


def test_decodes_the_pickles_exactly(cifar):
  root, arrays = cifar
  c = _config(root)
  for name, size in (("train", 5 * PER_BATCH), ("test", TEST)):
    images, labels = cifar10.load_cifar10(name, c.data)
    assert images.dtype == np.uint8 and images.shape == (size, 32, 32, 3)
    np.testing.assert_array_equal(images, arrays[name][0])  # HWC, in order
    np.testing.assert_array_equal(labels, arrays[name][1])
  # The eval split is not augmented: dataset_fn's images are the pixels.
  images, labels = _as_arrays(cifar10.dataset_fn(c, "test"))
  assert images.dtype == np.float32 and labels.dtype == np.int32
  np.testing.assert_array_equal(_pixels(images), arrays["test"][0])
  np.testing.assert_array_equal(labels, arrays["test"][1])
  # A pixel's channels come from the three planes of the row.
  with open(root / "cifar-10-batches-py" / "test_batch", "rb") as f:
    row = pickle.load(f, encoding="bytes")[b"data"][0]
  np.testing.assert_array_equal(_pixels(images)[0, 0, 1],
                                [row[1], row[1024 + 1], row[2048 + 1]])


def test_slices(cifar):
  root, arrays = cifar
  c = _config(root, data__augment_epochs=0)
  _, labels = _as_arrays(cifar10.dataset_fn(c, "train[:90%]"))
  assert len(labels) == 288
  np.testing.assert_array_equal(labels, arrays["train"][1][:288])
  images, labels = _as_arrays(cifar10.dataset_fn(c, "train[100:150]"))
  np.testing.assert_array_equal(_pixels(images), arrays["train"][0][100:150])
  with pytest.raises(lc.ConfigError, match=r"config\.data\.eval_split="):
    cifar10.dataset_fn(c, "validation")


def _crop_and_flip(augmented, original):
  """(dy, dx, flipped) such that `augmented` is that crop of `original`."""
  padded = np.pad(original, [(4, 4), (4, 4), (0, 0)])
  # Every 32x32 window of the padded image: [9, 9, 32, 32, 3].
  windows = np.lib.stride_tricks.sliding_window_view(
      padded, (32, 32, 3))[:, :, 0]
  for flipped, target in ((False, augmented), (True, augmented[:, ::-1])):
    hits = np.argwhere(np.all(windows == target, axis=(2, 3, 4)))
    if len(hits):
      return int(hits[0][0]), int(hits[0][1]), flipped
  raise AssertionError("not a padded crop of the original, flipped or not")


def test_train_split_is_cropped_and_flipped(cifar):
  root, arrays = cifar
  c = _config(root, data__augment_epochs=2, data__eval_split="test")
  dataset = cifar10.dataset_fn(c, "train")
  assert dataset.cardinality().numpy() == 2 * 5 * PER_BATCH
  images, labels = _as_arrays(dataset)
  assert images.shape == (640, 32, 32, 3)
  originals = arrays["train"][0]
  np.testing.assert_array_equal(labels, np.tile(arrays["train"][1], 2))
  # Copy k of image i is at k * 320 + i; each is a padded crop of image i.
  found = [_crop_and_flip(image, originals[i % 320])
           for i, image in enumerate(_pixels(images))]
  offsets = {(dy, dx) for dy, dx, _ in found}
  flips = sum(flipped for _, _, flipped in found)
  assert len(offsets) > 40 and 200 < flips < 440, (len(offsets), flips)
  changed = [(dy, dx, f) != (4, 4, False) for dy, dx, f in found]
  assert sum(changed) > 600  # (4, 4) unflipped is the identity
  # The two copies of an image mostly differ: a new crop each epoch.
  assert sum(a != b for a, b in zip(found[:320], found[320:])) > 280

  again, _ = _as_arrays(cifar10.dataset_fn(c, "train"))
  np.testing.assert_array_equal(again, images)  # same seed: same pixels
  c.seed = 1
  other, _ = _as_arrays(cifar10.dataset_fn(c, "train"))
  assert np.mean(np.any(other != images, axis=(1, 2, 3))) > 0.8


def test_a_split_trained_and_evaluated_on_is_not_augmented(cifar):
  root, arrays = cifar
  c = _config(root, data__train_split="test", data__eval_split="test")
  images, _ = _as_arrays(cifar10.dataset_fn(c, "test"))
  np.testing.assert_array_equal(_pixels(images), arrays["test"][0])


def test_missing_files_name_the_dir(tmp_path):
  with pytest.raises(lc.ConfigError) as e:
    cifar10.dataset_fn(_config(tmp_path), "train")
  message = str(e.value)
  assert "\n" not in message
  assert str(tmp_path) in message and "data.dir" in message
  assert "data_batch_1..5" in message and "cifar-10-batches-py" in message


def test_incomplete_and_corrupt_files(cifar, tmp_path):
  root, _ = cifar
  source = root / "cifar-10-batches-py"
  for i in (1, 2):
    (tmp_path / f"data_batch_{i}").write_bytes(
        (source / f"data_batch_{i}").read_bytes())
  with pytest.raises(lc.ConfigError, match="data_batch_3, data_batch_4") as e:
    cifar10.load_cifar10("train", _config(tmp_path).data)
  assert "\n" not in str(e.value)

  bad = tmp_path / "test_batch"
  bad.write_bytes(b"<html>not a pickle</html>")
  with pytest.raises(lc.ConfigError) as e:
    cifar10.load_cifar10("test", _config(tmp_path).data)
  assert "\n" not in str(e.value) and str(bad) in str(e.value)
  # A pickle that would run code is refused, not run.
  bad.write_bytes(pickle.dumps({b"data": print}, protocol=2))
  with pytest.raises(lc.ConfigError, match=r"references \S*\.print"):
    cifar10.load_cifar10("test", _config(tmp_path).data)
  bad.write_bytes(pickle.dumps({b"data": np.zeros((3, 3072), np.uint8),
                                b"labels": [0, 1, 10]}, protocol=2))
  with pytest.raises(lc.ConfigError, match=r"class ids in \[0, 10\)"):
    cifar10.load_cifar10("test", _config(tmp_path).data)


def test_download_failure_is_one_line(tmp_path):
  c = _config("")
  c.data.cache_dir, c.data.url = str(tmp_path), DEAD_URL
  with pytest.raises(lc.ConfigError) as e:
    cifar10.dataset_fn(c, "test")
  message = str(e.value)
  assert "\n" not in message
  assert DEAD_URL in message and "data.dir" in message
  assert list(tmp_path.iterdir()) == []


def test_download_from_loopback_server(cifar, tmp_path):
  """The online path: the archive is fetched, hash-checked, extracted once."""
  root, arrays = cifar
  served = tmp_path / "served"
  served.mkdir()
  archive = served / "cifar-10-python.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:  # the original's layout
    tar.add(root / "cifar-10-batches-py", arcname="cifar-10-batches-py")

  c = _config("")
  c.data.cache_dir = str(tmp_path / "cache")
  with loopback_server(served) as base:
    c.data.url = f"{base}/cifar-10-python.tar.gz"
    c.data.file_hash = hashlib.sha256(archive.read_bytes()).hexdigest()
    images, labels = cifar10.load_cifar10("test", c.data)
  np.testing.assert_array_equal(images, arrays["test"][0])
  np.testing.assert_array_equal(labels, arrays["test"][1])
  # From the cache now: the server is gone and the URL is never tried.
  c.data.url = DEAD_URL
  images, _ = cifar10.load_cifar10("train", c.data)
  np.testing.assert_array_equal(images, arrays["train"][0])


def test_model_fn_returns_float32_logits():
  c = cifar10.get_config()
  model = cifar10.model_fn(c)
  assert model.input_shape == (None, 32, 32, 3)
  assert model.output_shape == (None, 10) and model.output.dtype == "float32"
  convs = [l for l in model.layers if l.__class__.__name__ == "Conv2D"]
  # ResNet-20: 19 3x3 convs and 2 projection shortcuts, plus the dense.
  assert len(convs) == 21
  assert max(l.filters for l in convs) == 64
  # Global-batch statistics: a replica's own would change the loss curve
  # with the replica count (by 0.017 at step 1 on 2 CPU replicas).
  norms = [l for l in model.layers if l.__class__.__name__ ==
           "BatchNormalization"]
  assert len(norms) == 21 and all(l.synchronized for l in norms)


@pytest.mark.slow  # trains or compiles for seconds
def test_trains_end_to_end(cifar, tmp_path):
  root, _ = cifar
  c = _config(root, model__width=8, model__blocks=1, model__dropout=0.1,
              data__augment_epochs=4)
  c.train.steps, c.train.batch_size, c.train.steps_per_loop = 30, 32, 30
  c.optimizer.warmup_steps = 5
  c.eval.every_steps, c.eval.batch_size = 0, 100
  c.checkpoint.every_steps = 0
  result = run.run(c, str(tmp_path), mode="train_and_eval")
  assert result["step"] == 30
  assert result["eval"]["examples"] == TEST
  # Chance is 0.1.
  assert result["eval"]["accuracy"] >= 0.5, result["eval"]


@pytest.mark.slow  # trains or compiles for seconds
def test_ready_for_a_tpu(cifar):
  """`looper check` passes the shipped config (a narrower net: same ops)."""
  from looper.cli import tpu_check  # pylint: disable=g-import-not-at-top
  root, _ = cifar
  c = _config(root, data__augment_epochs=1)
  c.model.width, c.model.blocks = 4, 1
  assert tpu_check.check(c, cores=8) == []
