"""The public name of `looper.data.shards`: file mode's `Files` and the shard writer (`python -m looper.shards write`).

Experiments import `from looper import shards`; the code lives with the rest
of the input in `looper/data/`. This module IS that module: importing it
puts `looper.data.shards` in its place, so both names share one set of objects.
"""

import sys

from looper.data import shards

if __name__ == "__main__":  # python -m looper.shards write ...
  shards.main(sys.argv)
else:
  sys.modules[__name__] = shards
