"""Checkpointer: async saves that restore exactly and never hide an error."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import checkpoint
from looper import run
from tests import tiny
from tests.conftest import checkpoint_tensors


def test_async_saves_equal_sync_saves_and_resume(tmp_path):
  for mode in ("sync", "async"):
    c = tiny.get_config()
    c.train.steps, c.checkpoint.every_steps, c.checkpoint.keep = 30, 10, 5
    c.checkpoint.async_save = mode == "async"
    run.run(c, str(tmp_path / mode), mode="train")
    c.train.steps = 40  # resume from an async checkpoint
    run.run(c, str(tmp_path / mode), mode="train")
  names = sorted(p.name for p in (tmp_path / "async/checkpoints").glob(
      "*.index"))
  assert names == ["ckpt-10.index", "ckpt-20.index", "ckpt-30.index",
                   "ckpt-40.index"]
  for step in (10, 20, 30, 40):
    want = checkpoint_tensors(tmp_path / f"sync/checkpoints/ckpt-{step}")
    got = checkpoint_tensors(tmp_path / f"async/checkpoints/ckpt-{step}")
    assert sorted(want) == sorted(got) and len(want) >= 10
    for key in want:
      np.testing.assert_array_equal(want[key], got[key], err_msg=key)


def test_a_failed_background_write_is_raised(tmp_path):
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  directory = tmp_path / "checkpoints"
  ckpt = checkpoint.Checkpointer(str(directory), {"model": model}, keep=3,
                                 chief=True, task_id=0, async_save=True)
  ckpt.save(1)
  ckpt.wait()
  assert tf.train.latest_checkpoint(str(directory)) == f"{directory}/ckpt-1"
  for name in os.listdir(directory):  # the disk goes away under the writer
    os.remove(directory / name)
  os.rmdir(directory)
  directory.write_text("not a directory")
  ckpt.save(2)  # returns at once; the write fails in the background
  with pytest.raises(checkpoint.CheckpointError,
                     match=rf"^the background save of {directory}/ckpt-2"
                     r" failed \(.+\); the newest complete checkpoint is"
                     r" None; check the disk, or set"
                     r" --config.checkpoint.async_save=False$"):
    ckpt.wait()
