"""Fashion-MNIST, full size and real, through experiments/mnist.py.

The files are ../shared/data/fashion_mnist (60,000 / 10,000 IDX images);
the checks below recompute what its README states (MD5 of the uncompressed
files, 6,000 / 1,000 images per class) from the files themselves. The runs
are shrunk (a few thousand real images, tens of steps); the full benchmark
is `python -m tests.bench.time_to_accuracy --task=fashion` (the benchmarks
page).
"""

import gzip
import hashlib

import numpy as np
import pytest
import tensorflow as tf

from experiments import mnist
from looper import run
from looper.cli import tpu_check
from tests.fixtures import pieces
from tests.fixtures.configs import configured
from tests.fixtures.paths import ROOT

FASHION = ROOT.parent / "shared" / "data" / "fashion_mnist"
pytestmark = pytest.mark.skipif(not FASHION.is_dir(),
                                reason=f"no Fashion-MNIST at {FASHION}")
# The README's MD5s of the uncompressed files.
MD5 = {"train-images": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
       "train-labels": "9018921c3c673c538a1fc5bad174d6f9",
       "t10k-images": "8181f5470baa50b63fa0f6fddb340f0a",
       "t10k-labels": "15d484375f8d13e6eb1aabb0c3f46965"}


def _config(**fields):
  return configured(mnist.get_config(), {"data.dir": str(FASHION), **fields})


def _raw(name: str) -> bytes:
  kind = "idx3" if name.endswith("images") else "idx1"
  with gzip.open(FASHION / f"{name}-{kind}-ubyte.gz", "rb") as f:
    return f.read()


@pytest.mark.slow  # trains or compiles for seconds
def test_the_full_splits_read_as_the_readme_says():
  for name, digest in MD5.items():
    assert hashlib.md5(_raw(name)).hexdigest() == digest, name
  c = _config()
  for split, prefix, n in (("train", "train", 60_000), ("test", "t10k", 10_000)):
    images, labels = mnist.dataset_fn(c, split)
    assert images.shape == (n, 28, 28, 1) and images.dtype == np.float32
    np.testing.assert_array_equal(np.bincount(labels), [n // 10] * 10)
    # Byte 16 on: the pixels; byte 8 on: the labels (the IDX headers).
    pixels = np.frombuffer(_raw(f"{prefix}-images"), np.uint8, offset=16)
    np.testing.assert_array_equal(images.reshape(-1),
                                  pixels.astype(np.float32) / 255)
    np.testing.assert_array_equal(
        labels, np.frombuffer(_raw(f"{prefix}-labels"), np.uint8, offset=8))


@pytest.mark.slow  # trains or compiles for seconds
def test_the_tutorial_cnn_learns_real_clothes(tmp_path):
  """40 steps of the TensorFlow tutorial's CNN on 5,120 real train images;
  eval on 1,000 real test images, each counted once (0.735 measured, AMD
  EPYC; 0.817 at 80 steps)."""
  c = _config(**{
      "model.arch": "tutorial", "data.train_split": "train[:5120]",
      "data.eval_split": "test[:1000]", "train.steps": 40,
      "train.batch_size": 64, "train.steps_per_loop": 40,
      "eval.every_steps": 0, "checkpoint.every_steps": 0,
      "optimizer.schedule": "constant"})
  result = run.run(c, str(tmp_path), "train_and_eval")
  assert result["eval"]["examples"] == 1000
  assert result["eval"]["accuracy"] > 0.65, result["eval"]  # chance: 0.1
  model = pieces.trainer(c, tf.distribute.get_strategy()).model
  # conv 32 5x5, conv 64 5x5, dense 7*7*64 -> 1024, logits: the tutorial's.
  assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == (
      25 * 32 + 32) + (25 * 32 * 64 + 64) + (3136 * 1024 + 1024) + (
          1024 * 10 + 10)


@pytest.mark.slow  # trains or compiles for seconds
def test_the_recipe_network_flips_and_passes_looper_check():
  """tutorial_bn with flips: synchronized batch norm and looper's
  RandomFlip compile for 8 TPU cores; flips change the training step
  only."""
  c = _config(**{"model.arch": "tutorial_bn", "model.flip": True,
                 "data.train_split": "train[:512]",
                 "data.eval_split": "test[:400]",
                 "train.precision": "mixed_bfloat16"})
  assert tpu_check.check(c) == []
  c.train.precision = "float32"  # bfloat16 would round the pixels
  t = pieces.trainer(c, tf.distribute.get_strategy())
  images, _ = mnist.dataset_fn(c, "test[:8]")
  flips = [layer for layer in t.model.layers if "flip" in layer.name]
  assert len(flips) == 1
  np.testing.assert_array_equal(flips[0](images, training=False), images)
  mirrored = flips[0](images, training=True).numpy()
  assert any(np.array_equal(m, i[:, ::-1]) and not np.array_equal(m, i)
             for m, i in zip(mirrored, images))
