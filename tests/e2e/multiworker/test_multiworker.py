"""Multi-worker through `looper.cli.launch` on 127.0.0.1: resume across topologies.

On CPU each worker is one replica. A run resumes across topologies (the
data position is in global examples), its per-step losses those of one
process (float tolerance: the all-reduce sums in another order). 3 workers
against one process in element, array and file mode (eval counted once,
written once by the chief) run each worker on its own host:
tests/e2e/multiworker/test_hosts.py.
"""

import numpy as np
import pytest

from tests.fixtures.configs import run_here
from tests.fixtures.events import curve
from tests.unit.cli.test_launch import launch

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

# 48 splits over 1, 2, 3 and 4 replicas; 1009 examples is a prime.
ARGS = ("--config=tests/fixtures/tiny.py", "--config.train.batch_size=48",
        "--config.eval.batch_size=48", "--config.model.num_examples=1009",
        "--config.train.steps_per_loop=5", "--config.checkpoint.every_steps=10",
        "--config.eval.every_steps=10",
        # Dropout masks too must not depend on the topology.
        "--config.model.dropout=0.3")


def launched(workers, *args):
  proc = launch(*ARGS, *args, workers=workers)
  out = proc.communicate(timeout=400)[0]
  assert proc.returncode == 0, out[-3000:]
  return out


def test_resume_across_topologies(tmp_path):
  run_here(*ARGS, "--config.train.steps=20", f"--workdir={tmp_path}/whole")
  whole = curve(tmp_path / "whole" / "train")
  # 2 workers, then 1 process; and 1 process, then 2 workers.
  launched(2, "--config.train.steps=10", f"--workdir={tmp_path}/a")
  run_here(*ARGS, "--config.train.steps=20", f"--workdir={tmp_path}/a")
  run_here(*ARGS, "--config.train.steps=10", f"--workdir={tmp_path}/b")
  launched(2, "--config.train.steps=20", f"--workdir={tmp_path}/b")
  for run in ("a", "b"):
    np.testing.assert_allclose(curve(tmp_path / run / "train"), whole,
                               rtol=1e-5, err_msg=run)
