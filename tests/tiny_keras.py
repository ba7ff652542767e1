"""tests/tiny.py as a Keras user writes its loss and metrics: objects made
in get_config() (looper.options.keras_objects).

Synopsis::

    looper describe --config=tests/tiny_keras.py \
        --config.distribution.num_cpu_devices=2
"""

import keras

from tests import tiny


def get_config():
  c = tiny.get_config()
  c.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  # Objects with variables, made before looper sets the devices up.
  c.metrics = ("accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2))
  return c
