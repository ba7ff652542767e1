"""A tiny experiment on synthetic data that the tests run in seconds.

Synopsis::

    python -m looper.main --config=tests/tiny.py --workdir=/tmp/tiny

Four classes of 8-feature points; the label is a linear function of the
features, so a small MLP learns it. `data.dir` is unused. With
`model.embed=N` each feature comes as a token (its bin of BINS, one
vocabulary per feature) and the model looks them up in an Embedding of
width N: the sparse gradients of every text model.
"""

import keras
import numpy as np
import tensorflow as tf

from looper import config as lc
from looper.train import layers

NUM_CLASSES = 4
FEATURES = 8
BINS = 10  # tokens per feature under model.embed


def make_data(num: int, seed: int):
  """`num` examples, deterministic in `seed` (the test's reference too)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num, FEATURES)).astype(np.float32)
  w = np.random.default_rng(1234).normal(size=(FEATURES, NUM_CLASSES))
  y = np.argmax(x @ w, axis=1).astype(np.int32)
  return x, y


def tokens(x: np.ndarray) -> np.ndarray:
  """Feature j of `x` as token j * BINS + its bin (int32)."""
  bins = np.clip(np.floor((x + 2.5) * BINS / 5), 0, BINS - 1).astype(np.int32)
  return bins + BINS * np.arange(FEATURES, dtype=np.int32)


def keras_random_model(width: int) -> keras.Model:
  """An MLP through every random layer of Keras' looper adopts
  (looper.train.randomness.PER_EXAMPLE), in plain Keras as a user writes
  it: the 8 features as a 4x4 image (flip, spatial dropout) and a sequence
  of 4 (spatial dropout, attention with dropout)."""
  L = keras.layers  # pylint: disable=invalid-name
  inputs = keras.Input((FEATURES,))
  h = L.Dense(width, activation="relu")(inputs)
  h = L.Dropout(0.3)(h)
  h = L.GaussianNoise(0.1)(h)
  h = L.GaussianDropout(0.2)(h)
  h = L.AlphaDropout(0.1)(h)
  image = L.Reshape((4, width // 4, 1))(h)
  image = L.RandomFlip("horizontal")(image)
  image = L.SpatialDropout2D(0.2)(image)
  sequence = L.SpatialDropout1D(0.2)(L.Reshape((4, width // 4))(image))
  sequence = L.MultiHeadAttention(2, 4, dropout=0.2)(sequence, sequence)
  return keras.Model(inputs, L.Dense(NUM_CLASSES)(L.Flatten()(sequence)))


def model_fn(config):
  if config.model.keras_random:
    return keras_random_model(config.model.width)
  regularizer = keras.regularizers.L2(config.model.l2) if config.model.l2 else None
  dropout = ([layers.Dropout(config.model.dropout, seed=7)]
             if config.model.dropout else [])
  embed = ([keras.layers.Embedding(FEATURES * BINS, config.model.embed),
            keras.layers.Flatten()] if config.model.embed else [])
  return keras.Sequential([
      keras.Input((FEATURES,), dtype="int32" if embed else "float32"),
      *embed,
      keras.layers.Dense(config.model.width, activation="relu",
                         kernel_regularizer=regularizer),
      *dropout,
      keras.layers.Dense(NUM_CLASSES, kernel_regularizer=regularizer),
  ])


def dataset_fn(config, split):
  field = lc.split_field(config, split)
  name, selected = lc.split_slice(split, config.model.num_examples, field)
  x, y = make_data(config.model.num_examples, seed={"train": 0, "test": 1}[name])
  if config.model.embed:
    x = tokens(x)
  if config.data.as_arrays:  # array mode
    return x[selected], y[selected]
  return tf.data.Dataset.from_tensor_slices((x[selected], y[selected]))


def get_config():
  c = lc.default_config()
  c.model_fn = model_fn
  c.dataset_fn = dataset_fn
  c.train.steps = 40
  c.train.batch_size = 32
  c.train.steps_per_loop = 10
  c.eval.every_steps = 20
  c.eval.batch_size = 64
  c.checkpoint.every_steps = 20
  c.data.shuffle_buffer = 64
  c.data.as_arrays = False  # True: return numpy arrays (array mode)
  c.optimizer.name = "sgd"
  c.optimizer.learning_rate = 0.1
  c.model.width = 16
  c.model.l2 = 1e-3
  c.model.dropout = 0.0  # > 0: looper's replica-invariant Dropout
  # Keras' own random layers (keras_random_model) instead of the MLP.
  c.model.keras_random = False
  c.model.embed = 0  # > 0: token inputs and an Embedding of this width
  c.model.num_examples = 1001  # not a multiple of any batch size
  return c
