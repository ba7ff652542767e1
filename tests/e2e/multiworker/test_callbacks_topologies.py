"""Keras callbacks on 2 replicas and on 2 workers: they stop where fit does.

The same run as tests/unit/control/test_callbacks.py's (fit_like's
ReduceLROnPlateau, EarlyStopping and CSVLogger), on 2 replicas in the
test's process and on 2 workers (`looper launch`): every worker decides alike,
the chief alone writes the CSV file, and its rows are those of Keras' own
`model.fit(steps_per_execution=5)` on one device: the same epochs' logs,
learning rates and the same early stop.
"""

import pytest

from tests.fixtures import callbacks as fixture
from tests.fixtures.configs import configured, run_here
from tests.unit.cli.test_launch import launch
from tests.unit.control.test_callbacks import assert_same_rows, read_csv

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

CONFIG = "--config=tests/fixtures/callbacks.py"


def test_early_stopping_on_2_replicas_and_2_workers_stops_where_fit_does(
    tmp_path):
  c = configured(fixture.get_config(), {"model.csv": str(tmp_path / "fit.csv")})
  history = fixture.fit(c, fixture.fit_like(c))
  want = read_csv(tmp_path / "fit.csv")
  assert len(want) == len(history.epoch) < 20  # it stopped early
  run_here(CONFIG, f"--workdir={tmp_path}/replicas",  # 2 logical CPUs
           f"--config.model.csv={tmp_path}/replicas.csv",
           "--config.distribution.num_cpu_devices=2")
  proc = launch(CONFIG, f"--workdir={tmp_path}/workers",
                f"--config.model.csv={tmp_path}/workers.csv", workers=2)
  out = proc.communicate(timeout=400)[0]
  assert proc.returncode == 0, out[-3000:]
  # Both workers ended there (exit 0: no worker waited for the other).
  assert (f"EarlyStopping.on_epoch_end set model.stop_training at step"
          f" {len(want) * 10})") in out
  for run in ("replicas", "workers"):
    assert_same_rows(read_csv(tmp_path / f"{run}.csv"), want)
