"""test_weights' cases on 4 replicas: single-device SGD, as on 1 and 2.

Synopsis::

    python -m tests.stress.weights            # ~15 s

The suite checks every case of tests/unit/options/test_weights.py on 1 and
2 replicas (its SUITE); this process, of 4 logical CPUs, runs the cases
that name 4 (plain, by weights with accumulation, tokens, file mode) on 4
replicas and file mode on 1, and checks them as the suite does (losses
and weights against the loss written out; file mode equal to 1 replica;
each eval set against NumPy).
"""

import os
import sys
import tempfile
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from looper.options import distribute  # pylint: disable=g-import-not-at-top
from tests.unit.options import test_weights as t  # pylint: disable=g-import-not-at-top

REPLICAS = 4


def main() -> int:
  devices = distribute.split_cpu(REPLICAS)
  with tempfile.TemporaryDirectory() as files:
    every = t.cases(pathlib.Path(files))
    runs = t.results(tf.distribute.get_strategy(), 1,
                     [c for c in every if c[0] == "files"])
    runs.update(t.results(tf.distribute.MirroredStrategy(devices), REPLICAS,
                          every))
    checked = []
    for name, kind, fields, replicas in t.CASES:
      if REPLICAS in replicas:
        t.check_case(runs, name, kind, fields, REPLICAS)
        checked.append(name)
    t.check_files(runs, (REPLICAS,))
    got = runs[f"tokens/{REPLICAS}"]
    t.assert_each_set_exact("tokens", got["eval"], np.array(got["outputs"]),
                            f"on {REPLICAS} replicas")
  print(f"on {REPLICAS} replicas, as single-device SGD: {', '.join(checked)},"
        " files; each eval set exact")
  sys.stdout.flush()
  os._exit(0)  # pylint: disable=protected-access  (freeing stalls: conftest)


if __name__ == "__main__":
  sys.exit(main())
