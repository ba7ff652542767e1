"""Tiny weighted experiments: sample weights, token losses, two heads.

Synopsis::

    c = weighted.get_config("examples")   # tiny's MLP, (x, y, w) examples
    c = weighted.get_config("tokens")     # per-token labels, 0/1 masks of
                                          # skewed lengths
    c = weighted.get_config("heads")      # {"class", "value"} outputs
    c.data.mode = "arrays"                # elements | arrays

Every split is in a fixed order (`data.shuffle_buffer=0` by default), so
global batch k is examples [kB, (k+1)B) and a test can recompute the run
with plain TensorFlow (`reference_losses`).
"""

import keras
import numpy as np
import tensorflow as tf

from looper import config as lc
from tests import tiny

T = 6  # tokens per example ("tokens")


def make_data(kind: str, num: int, seed: int):
  """(inputs, labels, weights) numpy arrays of `kind`."""
  x, y = tiny.make_data(num, seed)
  rng = np.random.default_rng(seed + 100)
  if kind == "examples":
    w = rng.uniform(0.0, 2.0, num).astype(np.float32)
    w[::7] = 0.0  # some examples left out
    return x, y, w
  if kind == "heads":
    value = (x[:, :1] * 2.0 - x[:, 1:2]).astype(np.float32)
    return x, {"class": y, "value": value}, rng.uniform(
        0.5, 1.5, num).astype(np.float32)
  # tokens: each token's features are the example's shifted by its place;
  # the first half of every 8 examples is long, the rest 1-2 tokens, so
  # replicas of one batch hold very different token counts.
  tokens = np.stack([np.roll(x, t, axis=1)[:, :4] for t in range(T)], 1)
  labels = np.argmax(tokens @ np.eye(4, dtype=np.float32)[::-1], -1)
  length = np.where(np.arange(num) % 8 < 4, T, 1 + np.arange(num) % 2)
  mask = (np.arange(T)[None] < length[:, None]).astype(np.float32)
  return tokens.astype(np.float32), labels.astype(np.int32), mask


def model_fn(config) -> keras.Model:
  kind = config.model.kind
  if kind == "tokens":  # a Dense per token: logits [batch, T, 4]
    return keras.Sequential([keras.Input((T, 4)),
                             keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(tiny.NUM_CLASSES)])
  inputs = keras.Input((tiny.FEATURES,))
  hidden = keras.layers.Dense(config.model.width, activation="relu")(inputs)
  if kind == "heads":
    return keras.Model(inputs, {
        "class": keras.layers.Dense(tiny.NUM_CLASSES, name="class")(hidden),
        "value": keras.layers.Dense(1, name="value")(hidden)})
  return keras.Model(inputs, keras.layers.Dense(tiny.NUM_CLASSES)(hidden))


def dataset_fn(config, split):
  field = lc.split_field(config, split)
  name, selected = lc.split_slice(split, config.model.num_examples, field)
  data = make_data(config.model.kind, config.model.num_examples,
                   seed={"train": 0, "test": 1}[name])
  data = tuple(tf.nest.map_structure(lambda a: a[selected], part)
               for part in data)
  if config.data.mode == "arrays":
    return data
  return tf.data.Dataset.from_tensor_slices(data)


def get_config(kind: str = "examples"):
  c = tiny.get_config()
  c.model_fn, c.dataset_fn = model_fn, dataset_fn
  c.model.kind = kind
  c.data.mode = "elements"
  c.data.shuffle_buffer = 0
  c.optimizer.momentum = 0.0  # plain SGD, as reference_losses
  c.model.num_examples = 1000
  if kind == "heads":
    c.loss = {"class": "sparse_categorical_crossentropy",
              "value": "mean_squared_error"}
    c.loss_weights = {"value": 0.5}
    c.metrics = {"class": ("accuracy",), "value": ("mean_squared_error",)}
  if kind == "tokens":
    c.loss_normalization = "weights"
  return c


def per_value_losses(kind: str, labels, outputs) -> dict:
  """Unweighted losses by output, written out (not looper's code)."""
  ce = lambda y, z: tf.nn.sparse_softmax_cross_entropy_with_logits(y, z)
  if kind == "heads":
    return {"class": ce(labels["class"], outputs["class"]),
            "value": tf.reduce_mean(
                tf.square(labels["value"] - outputs["value"]), -1)}
  return {"": ce(labels, outputs)}


def reference_loss(config, model, x, y, w, class_weights=None):
  """The global batch's loss as BUILD.md "Losses" defines it."""
  values = per_value_losses(config.model.kind, y, model(x, training=True))
  if class_weights is not None:
    w = w * tf.gather(tf.constant(class_weights, tf.float32), y)
  total = 0.0
  for name, v in values.items():
    ww = tf.reshape(w, w.shape + (1,) * (v.shape.rank - w.shape.rank))
    ww = tf.broadcast_to(ww, v.shape)
    denominator = (tf.reduce_sum(ww) if config.loss_normalization == "weights"
                   else tf.cast(tf.size(v), tf.float32))
    factor = (config.loss_weights or {}).get(name, 1.0)
    total += factor * tf.reduce_sum(v * ww) / denominator
  return total


def reference_losses(config, steps: int, class_weights=None,
                     unweighted: bool = False, order=None):
  """Per-step losses and final weights of plain SGD on the same batches,
  one device, the whole global batch at once (`unweighted`: every weight
  1, a control). `order`: the train examples' indices in the order the
  global batches take them, cycled (default: the split's order)."""
  keras.utils.set_random_seed(config.seed)
  model = model_fn(config)
  x, y, w = make_data(config.model.kind, config.model.num_examples, 0)
  if unweighted:
    w = np.ones_like(w)
  order = np.arange(len(x)) if order is None else np.asarray(order)
  batch = config.train.batch_size * config.train.grad_accum_steps
  losses = []
  for k in range(steps):
    rows = order[np.arange(k * batch, (k + 1) * batch) % len(order)]
    pick = lambda a: tf.constant(a[rows])
    with tf.GradientTape() as tape:
      loss = reference_loss(config, model, pick(x),
                            tf.nest.map_structure(pick, y), pick(w),
                            class_weights)
    grads = tape.gradient(loss, model.trainable_variables)
    for v, g in zip(model.trainable_variables, grads):
      v.assign_sub(config.optimizer.learning_rate * g)
    losses.append(float(loss))
  return np.array(losses), [v.numpy() for v in model.trainable_variables]
