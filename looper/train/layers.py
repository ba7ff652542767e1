"""Layers whose randomness does not depend on the replica count.

Synopsis::

    from looper.train import layers
    x = layers.Dropout(0.3, seed=1)(x)    # instead of keras.layers.Dropout
    x = layers.RandomFlip(seed=2)(images) # left-right, half of the images

Keras 3's random layers draw the SAME numbers on every replica under
tf.distribute (their SeedGenerator state is one mirrored variable), so 2
replicas drop the same units of different examples, and the loss curve
changes with the replica count. Here an example's draw is a function of
(seed, how many times the layer has run, the example's position in the
GLOBAL batch): every replica draws the noise of the whole global batch from
the same seed and keeps its own rows. Looper's input
modes all give an example the same global position on any topology, so
the loss curve is the same on 1, 2, 4 replicas or several workers. The
random state is in the checkpoint, so a resumed run draws what it would
have drawn. Each replica draws the whole global batch's noise (R times its
own on R replicas): cheap next to the layer's matmul on a few replicas; a
known cost on a large TPU slice (a counter-based draw per example would
avoid it).
"""

import keras
import tensorflow as tf


class GlobalBatchNoise(keras.layers.Layer):
  """A layer drawing uniform noise per example of the global batch."""

  def __init__(self, seed: int | None = None, **kwargs):
    super().__init__(**kwargs)
    self.seed = seed
    self.seed_generator = keras.random.SeedGenerator(seed)
    # A SeedGenerator is not a TF trackable: without this reference its
    # state is missing from tf.train.Checkpoint and a resumed run would
    # replay the draws of step 1.
    self.rng_state = self.seed_generator.state

  def noise(self, shape) -> tf.Tensor:
    """Uniform [0, 1) noise of `shape` ([rows, ...] for this replica's rows):
    this replica's rows of the global batch's draw."""
    # Advances once per call on every replica alike: a function of the step.
    seed = tf.cast(self.seed_generator.next(), tf.int64)
    context = tf.distribute.get_replica_context()
    return rows_of_global_draw(seed, shape, context.replica_id_in_sync_group,
                               context.num_replicas_in_sync)

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    return {**super().get_config(), "seed": self.seed}


def rows_of_global_draw(seed, shape, replica, replicas: int) -> tf.Tensor:
  """Rows [replica * n, (replica + 1) * n) of one uniform draw of shape
  [n * replicas, ...] from `seed`, where `shape` is [n, ...].

  `replica` may be a runtime tensor (it is on a TPU): the slice has a
  static size, which XLA compiles to a dynamic slice (tested under
  jit_compile). TensorFlow's XLA and CPU kernels draw different numbers
  from one seed (measured), so the noise is the same on any replica count
  of one platform, not across platforms.
  """
  rows = shape[0]
  noise = tf.random.stateless_uniform(
      tf.concat([[rows * replicas], shape[1:]], axis=0), seed)
  replica = tf.cast(replica, tf.int32)
  return noise[replica * rows:(replica + 1) * rows]


@keras.saving.register_keras_serializable(package="looper")
class Dropout(GlobalBatchNoise):
  """Inverted dropout of rate `rate`, replica-count invariant (see module)."""

  def __init__(self, rate: float, seed: int | None = None, **kwargs):
    super().__init__(seed, **kwargs)
    if not 0 <= rate < 1:
      raise ValueError(f"Dropout rate must be in [0, 1), got {rate}")
    self.rate = rate

  def call(self, inputs, training=False):
    if not training or not self.rate:
      return inputs
    keep = self.noise(tf.shape(inputs)) >= self.rate
    return tf.where(keep, inputs / (1 - self.rate), tf.zeros_like(inputs))

  def get_config(self):
    return {**super().get_config(), "rate": self.rate}


@keras.saving.register_keras_serializable(package="looper")
class RandomFlip(GlobalBatchNoise):
  """In training, flips each image [height, width, channels] left-right
  with probability 1/2, replica-count invariant (see module); identity in
  eval and serving."""

  def call(self, inputs, training=False):
    if not training:
      return inputs
    flip = self.noise(tf.shape(inputs)[:1]) < 0.5
    return tf.where(flip[:, tf.newaxis, tf.newaxis, tf.newaxis],
                    tf.reverse(inputs, axis=[2]), inputs)
