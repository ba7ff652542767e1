"""test_replicas' run on 4 replicas: the same curve, eval, health and per-step values as on 1.

Synopsis::

    python -m tests.stress.replicas            # ~20 s

The suite runs tests/e2e/replicas/test_replicas.py on 1 and 2 replicas;
this runs it on 1 and 4 (4 processes' worth of logical CPUs in one, eval
batches of 16 per replica) and checks it as the suite does: the per-step
losses (with dropout, clipping, accumulation and the weight average), eval
counts and metrics, the train accuracy, the health figures and the
per-step values, against one replica's.
"""

import os
import pathlib
import shutil
import sys
import tempfile

from tests.fixtures import private_home
from tests.fixtures.processes import LOOPBACK_ENV

REPLICAS = (4,)


def main() -> int:
  # As the test session: loopback only, a HOME of its own (before Keras).
  os.environ.update(LOOPBACK_ENV)
  private_home.enter()
  from tests.e2e.replicas import test_replicas as t  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(tempfile.mkdtemp(prefix="looper-replicas-"))
  try:
    runs = t.run_all(root, REPLICAS)
    t.check_curves(runs, REPLICAS)
    t.check_eval(runs, REPLICAS)
    t.check_train_metrics(runs, REPLICAS)
    t.check_health(runs, REPLICAS)
    t.check_step_values(runs, REPLICAS)
  finally:
    shutil.rmtree(root, ignore_errors=True)
    private_home.leave()
  print("4 replicas equal 1: curve, eval, train accuracy, health, values")
  sys.stdout.flush()
  os._exit(0)  # pylint: disable=protected-access  (freeing stalls: conftest)


if __name__ == "__main__":
  sys.exit(main())
