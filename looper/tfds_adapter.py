"""The public name of `looper.data.tfds_adapter`: a TensorFlow Datasets dataset as a `dataset_fn` (`c.dataset_fn = "looper.tfds_adapter:dataset_fn"`).

Experiments import `from looper import tfds_adapter`; the code lives with the rest
of the input in `looper/data/`. This module IS that module: importing it
puts `looper.data.tfds_adapter` in its place, so both names share one set of objects.
"""

import sys

from looper.data import tfds_adapter

sys.modules[__name__] = tfds_adapter
