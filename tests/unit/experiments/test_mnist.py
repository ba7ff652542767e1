"""Tests of experiments/mnist.py's loading, splits, errors and model.

Run::

    cd /work/main && PYTHONPATH=. python -m pytest -q tests/unit/experiments/test_mnist.py

The data is the real MNIST test set in experiments/data/mnist; the reference
values are parsed here with gzip + struct, independently of the loader.
Nothing leaves the machine: the only URLs are on 127.0.0.1.
"""

import gzip
import shutil
import struct

import keras
from keras.src.datasets import mnist as keras_mnist
import ml_collections
import numpy as np
import pytest

from experiments import mnist
from looper import config as lc
from tests.fixtures import catalogue
from tests.fixtures.configs import configured
from tests.fixtures.servers import loopback_server

BUNDLED = mnist.BUNDLED_DIR  # the real test set the repository carries
IMAGES_GZ = BUNDLED / "t10k-images-idx3-ubyte.gz"
LABELS_GZ = BUNDLED / "t10k-labels-idx1-ubyte.gz"
# Port 9 (discard) on loopback: nothing listens, so the connection is refused
# at once and no packet leaves the machine.
DEAD_URL = "http://127.0.0.1:9/mnist.npz"


def _reference():
  """The test set parsed by hand from the IDX layout in the README."""
  labels_raw = gzip.decompress(LABELS_GZ.read_bytes())
  images_raw = gzip.decompress(IMAGES_GZ.read_bytes())
  magic, count = struct.unpack(">II", labels_raw[:8])
  assert (magic, count) == (2049, 10_000)
  magic, count, rows, cols = struct.unpack(">IIII", images_raw[:16])
  assert (magic, count, rows, cols) == (2051, 10_000, 28, 28)
  images = np.frombuffer(images_raw[16:], np.uint8).reshape(count, rows, cols)
  labels = np.frombuffer(labels_raw[8:], np.uint8)
  return images, labels, labels_raw, images_raw


@pytest.fixture(scope="module")
def reference():
  return _reference()


def _config(data_dir, **data):
  return configured(mnist.get_config(), {
      "data.dir": str(data_dir), **{f"data.{k}": v for k, v in data.items()}})


def _data(data_dir, url=DEAD_URL, cache_dir="", file_hash=""):
  """A `data` block for load_mnist; the test servers' files have no hash."""
  return ml_collections.ConfigDict(dict(dir=data_dir, url=url,
                                        cache_dir=cache_dir,
                                        file_hash=file_hash))


def _as_arrays(arrays):
  """dataset_fn's arrays, checked to be what array mode takes."""
  images, labels = arrays
  assert isinstance(images, np.ndarray) and isinstance(labels, np.ndarray)
  return images, labels


def keras_download(monkeypatch, keras_dataset) -> tuple[str, str]:
  """(url, sha256) that Keras' own `keras_dataset.load_data()` downloads
  and checks: what it asks get_file for, stopped there (no download)."""
  asked = {}

  def get_file(**kwargs):
    asked.update(kwargs)
    raise InterruptedError("stopped before the download")

  monkeypatch.setattr(keras_dataset, "get_file", get_file)
  with pytest.raises(InterruptedError):
    keras_dataset.load_data()
  return asked["origin"], asked["file_hash"]


def test_get_config_validates_and_downloads_what_keras_checks(monkeypatch):
  c = mnist.get_config()
  lc.validate(c)
  assert (c.data.url, c.data.file_hash) == keras_download(monkeypatch,
                                                          keras_mnist)


def test_shared_idx_gz_splits(reference, no_network):
  ref_images, ref_labels, labels_raw, images_raw = reference
  c = _config(BUNDLED, train_split="test[:8000]", eval_split="test[8000:]")
  train = mnist.dataset_fn(c, c.data.train_split)
  evaluation = mnist.dataset_fn(c, c.data.eval_split)
  assert len(train[1]) == 8000 and len(evaluation[1]) == 2000
  assert train[0].shape[1:] == (28, 28, 1) and train[0].dtype == np.float32
  assert train[1].shape[1:] == () and train[1].dtype == np.int32

  images, labels = _as_arrays(train)
  assert images.shape == (8000, 28, 28, 1) and labels.shape == (8000,)
  assert labels[0] == labels_raw[8]  # byte 8: the first label after the header
  np.testing.assert_array_equal(labels, ref_labels[:8000])
  assert images.min() == 0.0 and images.max() == 1.0
  first = np.frombuffer(images_raw[16:16 + 784], np.uint8)
  # Exact: the loader divides float32 by 255 just as this reference does.
  np.testing.assert_array_equal(images[0].reshape(784),
                                first.astype(np.float32) / 255)

  eval_images, eval_labels = _as_arrays(evaluation)
  np.testing.assert_array_equal(eval_labels, ref_labels[8000:])
  np.testing.assert_array_equal(eval_images[-1, ..., 0],
                                ref_images[-1].astype(np.float32) / 255)


def test_percent_split(no_network):
  c = _config(BUNDLED)
  assert len(mnist.dataset_fn(c, "test[:10%]")[1]) == 1000
  assert len(mnist.dataset_fn(c, "test[95%:]")[1]) == 500


def test_uncompressed_idx_and_npz_match(reference, tmp_path, no_network):
  ref_images, ref_labels, labels_raw, images_raw = reference
  idx_dir, npz_dir = tmp_path / "idx", tmp_path / "npz"
  idx_dir.mkdir()
  npz_dir.mkdir()
  (idx_dir / "t10k-images-idx3-ubyte").write_bytes(images_raw)
  (idx_dir / "t10k-labels-idx1-ubyte").write_bytes(labels_raw)
  # The layout Keras publishes; the train arrays only have to exist.
  np.savez(npz_dir / "mnist.npz", x_train=ref_images[:5],
           y_train=ref_labels[:5], x_test=ref_images, y_test=ref_labels)

  for directory in (BUNDLED, idx_dir, npz_dir):
    images, labels = mnist.load_mnist("test", _data(str(directory)))
    assert images.dtype == np.uint8 and images.shape == (10_000, 28, 28)
    assert labels.dtype == np.uint8 and labels.shape == (10_000,)
    np.testing.assert_array_equal(images, ref_images)
    np.testing.assert_array_equal(labels, ref_labels)

  from_gz = _as_arrays(mnist.dataset_fn(_config(BUNDLED), "test[:300]"))
  from_npz = _as_arrays(mnist.dataset_fn(_config(npz_dir), "test[:300]"))
  for a, b in zip(from_gz, from_npz):
    np.testing.assert_array_equal(a, b)
  train_images, _ = mnist.load_mnist("train", _data(str(npz_dir)))
  np.testing.assert_array_equal(train_images, ref_images[:5])


def test_missing_files_name_the_dir(tmp_path, no_network):
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "mnist-dir-without-files", dir=tmp_path)):
    mnist.dataset_fn(_config(tmp_path), "test")


def test_missing_train_files_in_shared_dir(no_network):
  with pytest.raises(lc.ConfigError, match="train-images-idx3-ubyte") as e:
    mnist.dataset_fn(_config(BUNDLED), "train")
  assert "\n" not in str(e.value)


def test_download_failure_is_one_line(tmp_path):
  c = _config("", cache_dir=str(tmp_path), url=DEAD_URL)
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "mnist-download-failed", cache=tmp_path, url=repr(DEAD_URL))):
    mnist.dataset_fn(c, "test")
  assert list(tmp_path.iterdir()) == []  # no half-written file stays behind


def test_download_from_loopback_server(reference, tmp_path):
  ref_images, ref_labels, _, _ = reference
  served = tmp_path / "served"
  served.mkdir()
  np.savez(served / "mnist.npz", x_train=ref_images[:5],
           y_train=ref_labels[:5], x_test=ref_images[:50],
           y_test=ref_labels[:50])
  (served / "junk.npz").write_bytes(b"<html>not an npz</html>")

  cache = tmp_path / "cache"
  with loopback_server(served) as base:
    with pytest.raises(lc.ConfigError, match="has no t10k-images") as e:
      mnist.load_mnist("test", _data("", f"{base}/junk.npz", str(cache)))
    assert "\n" not in str(e.value)
    assert list(cache.iterdir()) == []  # the junk never became the cache
    # A file that is not the published one (its hash differs) is refused
    # and removed, with the field to change in the message.
    with pytest.raises(lc.ConfigError, match="hash") as e:
      mnist.load_mnist("test", _data("", f"{base}/mnist.npz", str(cache),
                                     file_hash=mnist.DEFAULT_HASH))
    assert "config.data.url" in str(e.value) and "\n" not in str(e.value)
    assert list(cache.iterdir()) == []

    images, labels = mnist.load_mnist(
        "test", _data("", f"{base}/mnist.npz", str(cache)))
    np.testing.assert_array_equal(images, ref_images[:50])
    np.testing.assert_array_equal(labels, ref_labels[:50])
    assert [p.name for p in cache.iterdir()] == ["mnist.npz"]
  # Served from the cache now: the dead URL is never tried.
  images, _ = mnist.load_mnist("test", _data("", cache_dir=str(cache)))
  np.testing.assert_array_equal(images, ref_images[:50])


def test_corrupt_idx_names_the_file(tmp_path, no_network):
  shutil.copy(LABELS_GZ, tmp_path)
  bad = tmp_path / "t10k-images-idx3-ubyte"
  bad.write_bytes(struct.pack(">IIII", 1234, 1, 28, 28) + bytes(784))
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "mnist-bad-file", file=bad, what="magic 1234, expected 2051")):
    mnist.load_mnist("test", _data(str(tmp_path)))


def test_truncated_idx_names_the_file(tmp_path, no_network):
  shutil.copy(LABELS_GZ, tmp_path)
  bad = tmp_path / "t10k-images-idx3-ubyte.gz"
  bad.write_bytes(gzip.compress(struct.pack(">IIII", 2051, 10_000, 28, 28) +
                                bytes(784)))
  with pytest.raises(lc.ConfigError) as e:
    mnist.load_mnist("test", _data(str(tmp_path)))
  assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_unknown_split_names_the_field(no_network):
  c = _config(BUNDLED, eval_split="validation")
  with pytest.raises(lc.ConfigError,
                     match=catalogue.line("mnist-unknown-split")):
    mnist.dataset_fn(c, "validation")


def test_model_fn_returns_float32_logits():
  c = mnist.get_config()
  c.model.width = 8
  model = mnist.model_fn(c)
  assert model.input_shape == (None, 28, 28, 1)
  assert model.output_shape == (None, 10)
  assert model.output.dtype == "float32"
  assert model.layers[-1].activation is keras.activations.linear  # logits
  assert model(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 10)


def test_model_fn_logits_stay_float32_under_mixed_precision():
  c = mnist.get_config()
  c.model.width = 8
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    model = mnist.model_fn(c)
  finally:
    keras.mixed_precision.set_global_policy(previous)
  assert model.layers[1].compute_dtype == "float16"
  assert model.output.dtype == "float32"


def test_validate_rejects_bad_width():
  c = configured(mnist.get_config(), {"model.width": 1})
  with pytest.raises(lc.ConfigError, match=catalogue.line("mnist-width")):
    lc.validate(c)
  lc.validate(configured(c, {"model.width": 2}))  # width // 2 = 1 unit
  mnist.model_fn(c)


def test_the_bundled_files_are_the_published_ones():
  import hashlib  # pylint: disable=g-import-not-at-top
  published = {"t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
               "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"}
  for name, md5 in published.items():
    assert hashlib.md5((BUNDLED / name).read_bytes()).hexdigest() == md5, name
  # Carried with its authors and licence.
  readme = (BUNDLED / "README.md").read_text()
  assert "Yann LeCun" in readme and "Attribution-Share Alike 3.0" in readme


def test_an_unknown_preset_is_one_line():
  with pytest.raises(lc.ConfigError) as e:
    mnist.get_config("bundle")
  assert str(e.value) == (
      "no such preset 'bundle'; use one of '', 'bundled' (after the ':')")
