"""Tests of looper/data/tfds_adapter.py: TFDS datasets through looper, offline.

Run::

    cd /work/main && PYTHONPATH=. python -m pytest -q tests/unit/data/test_tfds_adapter.py

Two sources, neither touching the network: `tfds.testing.mock_data` stands
in for the catalog's 'mnist' (random examples of the real feature specs),
and a small builder defined here is prepared into a temp data dir, so
tfds.load reads real TFDS files (with real split slicing) of
tests/fixtures/tiny.py's learnable data. Needs the extra: pip install -e
".[test,tfds]".
"""

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import run
from looper.data import tfds_adapter
from tests.fixtures import needs
from tests.fixtures import tiny
from tests.fixtures.configs import configured

NUM_TRAIN, NUM_TEST = 600, 200


@pytest.fixture(scope="module")
def tfds():
  return needs.extra("tensorflow_datasets", "tfds")


@pytest.fixture(scope="module")
def tiny_dir(tfds, tmp_path_factory):
  """A TFDS data dir holding 'looper_tiny': tests/fixtures/tiny.py's 4-class
  points
  as features 'x' (float32 [8]), 'x2' (int64 [2]) and 'label' (ClassLabel)."""

  class LooperTiny(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      features = tfds.features.FeaturesDict({
          "x": tfds.features.Tensor(shape=(tiny.FEATURES,), dtype=np.float32),
          "x2": tfds.features.Tensor(shape=(2,), dtype=np.int64),
          "label": tfds.features.ClassLabel(num_classes=tiny.NUM_CLASSES)})
      return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
      del dl_manager  # nothing to download
      return {"train": self._generate_examples(NUM_TRAIN, seed=0),
              "test": self._generate_examples(NUM_TEST, seed=1)}

    def _generate_examples(self, num, seed):
      x, y = tiny.make_data(num, seed)
      for i in range(num):
        yield i, {"x": x[i], "x2": [i, -i], "label": int(y[i])}

  directory = tmp_path_factory.mktemp("tfds")
  LooperTiny(data_dir=str(directory)).download_and_prepare()
  return directory


def _tiny_config(data_dir, **fields):
  c = tiny.get_config()
  c.dataset_fn = "looper.data.tfds_adapter:dataset_fn"
  tfds_adapter.add_fields(c, name="looper_tiny", keys=("x", "label"),
                          download=False)
  return configured(c, {"data.dir": str(data_dir),
                       **{f"data.{k}": v for k, v in fields.items()}})


def _examples(dataset):
  inputs, labels = next(iter(dataset.batch(10_000)))
  return tf.nest.map_structure(lambda t: t.numpy(), inputs), labels.numpy()


def test_missing_package_is_one_line(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # not found
  c = _tiny_config("/nowhere")
  with pytest.raises(lc.ConfigError) as e:
    tfds_adapter.dataset_fn(c, "train")
  assert str(e.value).endswith('pip install "looper[tfds]"')
  assert "\n" not in str(e.value)


def test_fields_must_be_set():
  c = tiny.get_config()
  with pytest.raises(lc.ConfigError, match=r"config\.data\.tfds_name is not"
                     r" set; call looper\.data\.tfds_adapter\.add_fields"):
    tfds_adapter.dataset_fn(c, "train")
  tfds_adapter.add_fields(c)
  with pytest.raises(lc.ConfigError, match=r"tfds_name is empty; set"):
    tfds_adapter.dataset_fn(c, "train")
  tfds_adapter.add_fields(c, name="mnist", keys=("image",))
  with pytest.raises(lc.ConfigError, match=r"tfds_keys=\('image',\) must"):
    tfds_adapter.dataset_fn(c, "train")


def test_splits_slices_and_keys(tfds, tiny_dir):
  del tfds
  c = _tiny_config(tiny_dir)
  x, y = _examples(tfds_adapter.dataset_fn(c, "train"))
  assert x.shape == (NUM_TRAIN, tiny.FEATURES) and y.dtype == np.int32
  # Each example is one of tiny.make_data's points with its own label
  # (TFDS stores them in its own order).
  ref_x, ref_y = tiny.make_data(NUM_TRAIN, seed=0)
  ids = np.array([np.flatnonzero((ref_x == row).all(1))[0] for row in x])
  assert sorted(ids) == list(range(NUM_TRAIN))
  np.testing.assert_array_equal(y, ref_y[ids])
  # TFDS slicing passes through, and the order is the same on every call
  # (looper rebuilds the dataset in every input pipeline).
  head, _ = _examples(tfds_adapter.dataset_fn(c, "train[:25%]"))
  np.testing.assert_array_equal(head, x[:NUM_TRAIN // 4])
  tail, _ = _examples(tfds_adapter.dataset_fn(c, "test[150:]"))
  assert len(tail) == 50
  # Several input keys: a dict of inputs.
  c.data.tfds_keys = ("x", "x2", "label")
  inputs, _ = _examples(tfds_adapter.dataset_fn(c, "test[:3]"))
  assert sorted(inputs) == ["x", "x2"] and inputs["x2"].shape == (3, 2)


def test_errors_are_one_line_naming_the_field(tfds, tiny_dir, tmp_path):
  del tfds
  cases = [
      (_tiny_config(tiny_dir, tfds_name="looper_tiy"), "train",
       r"^config\.data\.tfds_name='looper_tiy': no such TFDS dataset"),
      (_tiny_config(tiny_dir, eval_split="validation"), "validation",
       r"^config\.data\.eval_split='validation': Unknown split"),
      (_tiny_config(tiny_dir, train_split="train[900:]"), "train[900:]",
       r"^config\.data\.train_split='train\[900:\]': Requested slice"),
      (_tiny_config(tiny_dir, tfds_keys=("image", "label")), "train",
       r"no feature 'image'; its features are label, x, x2$"),
      (_tiny_config(tmp_path), "train",
       rf"not prepared in config\.data\.dir='{tmp_path}'.*tfds_download=True$"),
  ]
  for c, split, message in cases:
    with pytest.raises(lc.ConfigError, match=message) as e:
      tfds_adapter.dataset_fn(c, split)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_trains_end_to_end_on_tfds_files(tfds, tiny_dir, tmp_path):
  del tfds
  c = _tiny_config(tiny_dir)
  c.eval.every_steps = 0  # once, at the end
  result = run.run(c, str(tmp_path), mode="train_and_eval")
  assert result["step"] == 40 and result["eval"]["examples"] == NUM_TEST
  # 4 classes (chance: 25%); measured 0.94 after 40 steps.
  assert result["eval"]["accuracy"] >= 0.85, result["eval"]


def test_catalog_mnist_plugs_in_with_mock_data(tfds, tmp_path):
  """The one-line use on a catalog dataset: mnist's real feature specs, a
  few steps through looper.run; mock_data generates random examples, so
  only the plumbing is checked, not learning."""
  c = lc.default_config()
  c.model_fn = lambda config: keras.Sequential([
      keras.Input((28, 28, 1), dtype="uint8"), keras.layers.Rescaling(1 / 255),
      keras.layers.Flatten(), keras.layers.Dense(10)])
  c.dataset_fn = "looper.data.tfds_adapter:dataset_fn"
  tfds_adapter.add_fields(c, name="mnist", keys=("image", "label"),
                          download=False)
  c.data.dir = str(tmp_path / "tfds")
  c.train.update(steps=4, batch_size=16, steps_per_loop=2)
  c.eval.update(every_steps=0, batch_size=16)
  c.checkpoint.every_steps = 0
  with tfds.testing.mock_data(num_examples=40,
                              data_dir=str(tmp_path / "tfds")):
    image, label = tfds_adapter.dataset_fn(c, "train").element_spec
    result = run.run(c, str(tmp_path / "work"), mode="train_and_eval")
  assert (image.shape, image.dtype) == ((28, 28, 1), tf.uint8)
  assert (label.shape, label.dtype) == ((), tf.int32)
  assert result["step"] == 4 and result["eval"]["examples"] == 40
  assert np.isfinite(result["train"]["loss"])
