"""Multi-worker through `looper.cli.launch` on 127.0.0.1: resume across topologies.

On CPU each worker is one replica. A run resumes across topologies (the
data position is in global examples), its per-step losses, the per-step
values its train_step adds and its health figures those of one process
(float tolerance: the all-reduce sums in another order); its 2
workers shard the optimizer's state (distribution.shard_optimizer: Adam's
moments and the EMA, 1/2 each), the processes before and after do not, so
the checkpoint moves replicated -> sharded -> replicated (2 workers
replicated equal one process in test_slurm.py and
test_callbacks_topologies.py). The sharding is read from what each worker
built (its variables' shapes, logged at --verbosity=1) and from the
checkpoint the workers wrote (whole tensors, the one process' values). The
launch also holds `looper launch`'s own contract (its tests:
tests/unit/cli/test_launch.py): each worker's lines prefixed, its pid and
its share of the GPUs named, the workdir written by the chief only, one
attempt's time. 3 workers against one process in element, array and file
mode (eval counted once, written once by the chief) run each worker on its
own host: tests/e2e/multiworker/test_hosts.py.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from tests.fixtures.configs import run_here
from tests.fixtures.events import curve, scalars
from tests.unit.cli.test_launch import launch, pids

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

# 48 splits over 1, 2, 3 and 4 replicas; 1009 examples is a prime.
ARGS = ("--config=tests/fixtures/tiny.py", "--config.train.batch_size=48",
        "--config.eval.batch_size=48", "--config.model.num_examples=1009",
        "--config.train.steps_per_loop=5", "--config.checkpoint.every_steps=10",
        "--config.eval.every_steps=10",
        # Dropout masks too must not depend on the topology.
        "--config.model.dropout=0.3",
        # Two slots and an average per weight: sharded, each device holds
        # less than a replicated one (SGD's momentum alone plus the weight
        # shard would hold as much).
        "--config.optimizer.name=adam", "--config.optimizer.learning_rate=0.01",
        "--config.optimizer.ema_decay=0.9",
        # Per-step values beside the loss (the same on every topology).
        "--config.trainer=tests.fixtures.tiny:StepValues",
        "--config.train.grad_norm=True")


def launched(workers, *args, **env_vars):
  proc = launch(*ARGS, *args, workers=workers, **env_vars)
  out = proc.communicate(timeout=400)[0]
  assert proc.returncode == 0, out[-3000:]
  return out


def built_state(out: str) -> dict[str, int]:
  """device -> bytes of the optimizer state each worker logged it built
  (`optimizer state on DEVICE: NAME DTYPE[SHAPE]; ...`), added up here."""
  held = {}
  for device, parts in re.findall(r"optimizer state on (\S+): (.*)", out):
    assert device not in held, f"{device} logged twice"
    held[device] = int(sum(
        np.dtype(dtype).itemsize * np.prod([int(n) for n in dims.split(",")
                                            if n], dtype=int)
        for dtype, dims in re.findall(r" (\w+)\[([\d,]*)\]", parts)))
  return held


def sharded_bytes(checkpoint: str, replicas: int) -> tuple[int, int]:
  """(replicated, sharded) optimizer state per device expected from a
  replicated run's checkpoint: the int64 step, and each weight's slots and
  average, whole or ceil(size / replicas) of each; sharded, the weight's
  shard too."""
  shapes = dict(tf.train.list_variables(checkpoint))
  state = [np.prod(s, dtype=int) for k, s in shapes.items()
           if k.startswith(("optimizer/_variables/", "ema/"))]
  weights = [np.prod(s, dtype=int) for k, s in shapes.items()
             if k.startswith("optimizer/_trainable_variables/")]
  assert len(state) == 3 * len(weights)  # Adam's m and v, the average
  return (8 + 4 * sum(state),
          8 + 4 * sum(-(-n // replicas) for n in state + weights))


def assert_same_checkpoints(got: str, want: str) -> None:
  """The same tensors by name, shape and value (float tolerance)."""
  got_shapes, want_shapes = (dict(tf.train.list_variables(c))
                             for c in (got, want))
  assert got_shapes == want_shapes
  got, want = tf.train.load_checkpoint(got), tf.train.load_checkpoint(want)
  for key in want_shapes:
    if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
      np.testing.assert_allclose(got.get_tensor(key), want.get_tensor(key),
                                 rtol=1e-5, atol=1e-7, err_msg=key)


def test_resume_across_topologies(tmp_path):
  run_here(*ARGS, "--config.train.steps=30", f"--workdir={tmp_path}/whole")
  whole = curve(tmp_path / "whole" / "train")
  # 1 process, then 2 workers, then 1 process again: both directions.
  run_here(*ARGS, "--config.train.steps=10", f"--workdir={tmp_path}/run")
  # Two GPUs named the user's way: one each (a CPU-only TensorFlow ignores
  # the variable).
  out = launched(2, "--config.train.steps=20", f"--workdir={tmp_path}/run",
                 "--config.distribution.shard_optimizer=True",
                 "--verbosity=1", CUDA_VISIBLE_DEVICES="3,5")
  assert "[worker 0] " in out and "[worker 1] " in out
  first, second = pids(out.splitlines())
  assert f"[launch] worker 0: pid {first}, CUDA_VISIBLE_DEVICES=3\n" in out
  assert f"[launch] worker 1: pid {second}, CUDA_VISIBLE_DEVICES=5\n" in out
  assert "train step 20/20" in out
  # One header, the chief's; the other worker says whose run it joins.
  said = out.splitlines()
  assert [l.split("]")[0] for l in said if "]   strategy   " in l] == [
      "[worker 0"]
  [header, joined] = [l for l in said if " looper train_and_eval: " in l]
  assert header.startswith("[worker 0] ") and (
      " looper train_and_eval: sequential (" in header)
  assert joined.startswith("[worker 1] ") and joined.endswith(
      f" looper train_and_eval: worker 1 in {tmp_path}/run (resumed from"
      f" {tmp_path}/run/checkpoints/ckpt-10); its chief prints the run")
  # What each worker built: its device's slots, average and weight shard
  # add up to the sharded share of the one process' state.
  replicated, sharded = sharded_bytes(f"{tmp_path}/whole/checkpoints/ckpt-20",
                                      2)
  assert sharded < replicated
  assert built_state(out) == {
      f"/job:worker/replica:0/task:{i}/device:CPU:0": sharded for i in (0, 1)}
  # Their checkpoint holds the optimizer and the average whole, as the one
  # process saved them.
  assert_same_checkpoints(f"{tmp_path}/run/checkpoints/ckpt-20",
                          f"{tmp_path}/whole/checkpoints/ckpt-20")
  # Two workers resumed one process's run and trained like one process.
  np.testing.assert_allclose(curve(tmp_path / "run" / "train"), whole[:20],
                             rtol=1e-5)
  assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
      "checkpoints", "config.json", "eval", "goodput", "hparams",
      "metrics.jsonl", "train"]  # the chief's only
  # One attempt's time each, the first process's and the chief's (a
  # worker's would be attempt 3).
  assert sorted(p.name for p in (tmp_path / "run" / "goodput").iterdir()) == [
      "attempt-1.json", "attempt-2.json"]
  run_here(*ARGS, "--config.train.steps=30", f"--workdir={tmp_path}/run")
  np.testing.assert_allclose(curve(tmp_path / "run" / "train"), whole,
                             rtol=1e-5)
  # The per-step values and the health figures of the run across
  # topologies (steps 11-20 on 2 workers) are one process's too.
  for name in ("label_mean", "examples"):
    np.testing.assert_allclose(curve(tmp_path / "run" / "train", name),
                               curve(tmp_path / "whole" / "train", name),
                               rtol=1e-6, err_msg=name)
  assert set(curve(tmp_path / "run" / "train", "examples")) == {48}
  for name in ("grad_norm", "grad_norm_max", "weight_norm", "update_ratio"):
    got, want = (scalars(tmp_path / run / "train", name)
                 for run in ("run", "whole"))
    assert sorted(got) == sorted(want) == list(range(5, 31, 5)), name
    np.testing.assert_allclose([got[s] for s in sorted(got)],
                               [want[s] for s in sorted(want)], rtol=1e-5,
                               err_msg=name)
