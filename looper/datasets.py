"""The public name of `looper.data.datasets`: finding a dataset's files (`data.dir`, the cache, `keras.utils.get_file`).

Experiments import `from looper import datasets`; the code lives with the rest
of the input in `looper/data/`. This module IS that module: importing it
puts `looper.data.datasets` in its place, so both names share one set of objects.
"""

import sys

from looper.data import datasets

sys.modules[__name__] = datasets
