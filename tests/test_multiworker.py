"""Multi-worker through `looper.launch`: the same math as one process.

On CPU each worker is one replica, so 3 workers are 3 replicas. Per-step
losses are compared with one process (float tolerance: the all-reduce sums
in another order), eval counts a prime-sized split exactly once, and a run
resumes across topologies (the data position is in global examples).
"""

import numpy as np
import pytest

from looper import shards
from tests import tiny
from tests.conftest import curve, run_ok, scalars
from tests.test_launch import launch

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

# 48 splits over 1, 2, 3 and 4 replicas; 1009 examples is a prime.
ARGS = ("--config=tests/tiny.py", "--config.train.batch_size=48",
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


def test_three_workers_equal_one_process_and_count_eval_once(tmp_path):
  launched(3, "--config.train.steps=20", f"--workdir={tmp_path}/workers")
  run_ok(*ARGS, "--config.train.steps=20", f"--workdir={tmp_path}/single")
  run_ok(*ARGS, "--config.train.steps=20",
         "--config.distribution.num_cpu_devices=4", f"--workdir={tmp_path}/four")
  single = curve(tmp_path / "single" / "train")
  np.testing.assert_allclose(curve(tmp_path / "workers" / "train"), single,
                             rtol=1e-5)
  np.testing.assert_allclose(curve(tmp_path / "four" / "train"), single,
                             rtol=1e-5)
  for run in ("workers", "single", "four"):
    assert scalars(tmp_path / run / "eval", "examples") == {10: 1009,
                                                            20: 1009}
  # Written once, by the chief: no worker scratch directories remain.
  assert sorted(p.name for p in (tmp_path / "workers").iterdir()) == [
      "checkpoints", "config.json", "eval", "hparams", "metrics.jsonl",
      "train"]
  # One HParams row, the chief's.
  assert len(list((tmp_path / "workers" / "hparams").glob("*tfevents*"))) == 1


def test_resume_across_topologies(tmp_path):
  run_ok(*ARGS, "--config.train.steps=20", f"--workdir={tmp_path}/whole")
  whole = curve(tmp_path / "whole" / "train")
  # 2 workers, then 1 process; and 1 process, then 2 workers.
  launched(2, "--config.train.steps=10", f"--workdir={tmp_path}/a")
  run_ok(*ARGS, "--config.train.steps=20", f"--workdir={tmp_path}/a")
  run_ok(*ARGS, "--config.train.steps=10", f"--workdir={tmp_path}/b")
  launched(2, "--config.train.steps=20", f"--workdir={tmp_path}/b")
  for run in ("a", "b"):
    np.testing.assert_allclose(curve(tmp_path / run / "train"), whole,
                               rtol=1e-5, err_msg=run)


def test_file_and_array_modes_equal_one_process_on_two_workers(tmp_path):
  """File mode (16 groups) and array mode: 2 workers = 1 process = 4 replicas."""
  c = tiny.get_config()
  c.model.num_examples = 1009
  for split in ("train", "test"):
    shards.write(tiny.dataset_fn(c, split), str(tmp_path / "shards" / split),
                 min_shards=16)
  modes = {"files": (f"--config.data.shards_dir={tmp_path}/shards",
                     "--config.data.virtual_shards=16"),
           "arrays": ("--config.data.as_arrays=True",)}
  for mode, flags in modes.items():
    args = (*flags, "--config.train.steps=20")
    launched(2, *args, f"--workdir={tmp_path}/{mode}-workers")
    run_ok(*ARGS, *args, f"--workdir={tmp_path}/{mode}-single")
    single = curve(tmp_path / f"{mode}-single" / "train")
    np.testing.assert_allclose(curve(tmp_path / f"{mode}-workers" / "train"),
                               single, rtol=1e-5, err_msg=mode)
    assert scalars(tmp_path / f"{mode}-workers" / "eval", "examples") == {
        10: 1009, 20: 1009}
  run_ok(*ARGS, *modes["files"], "--config.train.steps=20",
         "--config.distribution.num_cpu_devices=4", f"--workdir={tmp_path}/four")
  np.testing.assert_allclose(curve(tmp_path / "four" / "train"),
                             curve(tmp_path / "files-single" / "train"),
                             rtol=1e-5)
