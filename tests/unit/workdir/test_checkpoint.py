"""Checkpointer: async saves that restore exactly and never hide an error."""

import os
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import run
from looper import workdir
from looper.workdir import checkpoint
from tests.fixtures import catalogue
from tests.fixtures import tiny
from tests.fixtures.checkpoints import checkpoint_tensors


@pytest.mark.slow  # over 2 s: out of the fast lane
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


@pytest.mark.parametrize("async_save", [False, True])
def test_the_durable_step_is_the_newest_save_known_complete(tmp_path,
                                                            async_save):
  """What trackers may send (looper.trackers.delivery): an async save
  counts once `wait` saw it end; a restore's step counts."""
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  wd = workdir.Workdir(str(tmp_path))
  ckpt = checkpoint.Checkpointer(wd, {"model": model}, keep=3, chief=True,
                                 task_id=0, async_save=async_save)
  assert ckpt.durable_step is None
  ckpt.save(10)
  assert ckpt.durable_step == (None if async_save else 10)
  ckpt.save(20)  # waits for the save of 10 first
  assert ckpt.durable_step == (10 if async_save else 20)
  ckpt.wait()
  assert ckpt.durable_step == 20
  ckpt.save_best(30)  # not a rolling checkpoint: a resume never reads it
  assert ckpt.durable_step == 20
  again = checkpoint.Checkpointer(wd, {"model": model}, keep=3, chief=True,
                                  task_id=0, async_save=async_save)
  again.restore()
  assert again.durable_step == 20


def test_a_failed_background_write_is_raised(tmp_path):
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  directory = tmp_path / "checkpoints"
  ckpt = checkpoint.Checkpointer(workdir.Workdir(str(tmp_path)),
                                 {"model": model}, keep=3, chief=True,
                                 task_id=0, async_save=True)
  ckpt.save(1)
  ckpt.wait()
  assert tf.train.latest_checkpoint(str(directory)) == f"{directory}/ckpt-1"
  for name in os.listdir(directory):  # the disk goes away under the writer
    os.remove(directory / name)
  os.rmdir(directory)
  directory.write_text("not a directory")
  ckpt.save(2)  # returns at once; the write fails in the background
  with pytest.raises(checkpoint.CheckpointError, match=catalogue.line(
      "background-save-failed", checkpoint=f"{directory}/ckpt-2",
      newest=None)):
    ckpt.wait()


@pytest.mark.parametrize("on_tpu,directory,device", [
    (True, "/tmp/run/checkpoints", "/job:localhost"),
    (True, "gs://bucket/run/checkpoints", None),
    (False, "/tmp/run/checkpoints", None),
])
def test_checkpoint_io_device(on_tpu, directory, device):
  """A TPU writes a local workdir through its host; gs:// directly."""
  assert checkpoint.io_device(on_tpu, directory) == device


def test_checkpoints_on_tpu_read_and_write_through_the_host(tmp_path):
  v = tf.Variable(3.0)
  ckpt = checkpoint.Checkpointer(workdir.Workdir(str(tmp_path)), {"v": v},
                                 keep=2, chief=True, task_id=0, on_tpu=True)
  devices = []
  real_save, real_restore = (tf.train.CheckpointManager.save,
                             tf.train.Checkpoint.restore)

  def save(self, checkpoint_number=None, options=None, **kwargs):
    devices.append(options.experimental_io_device)
    return real_save(self, checkpoint_number=checkpoint_number,
                     options=options, **kwargs)

  def restore(self, path, options=None):
    devices.append(options.experimental_io_device)
    return real_restore(self, path, options=options)

  with mock.patch.object(tf.train.CheckpointManager, "save", save), \
       mock.patch.object(tf.train.Checkpoint, "restore", restore):
    path = ckpt.save(step=1)
    v.assign(0.0)
    assert ckpt.restore() == path
  assert float(v) == 3.0
  assert devices == ["/job:localhost", "/job:localhost"]


def test_a_task_that_is_not_the_chief_keeps_no_copy(tmp_path):
  """Its saves (a collective under multi-worker) go to scratch, removed."""
  v = tf.Variable(1.0)
  other = checkpoint.Checkpointer(workdir.Workdir(str(tmp_path)), {"v": v},
                                  keep=2, chief=False, task_id=1)
  assert other.save(1) == f"{tmp_path}/.worker1_checkpoints/ckpt-1"
  assert other.save_best(1) == f"{tmp_path}/.worker1_checkpoints/best/ckpt-1"
  assert list(tmp_path.iterdir()) == []
  chief = checkpoint.Checkpointer(workdir.Workdir(str(tmp_path)), {"v": v},
                                  keep=2, chief=True, task_id=0)
  assert chief.save(1) == f"{tmp_path}/checkpoints/ckpt-1"
  assert chief.save_best(1) == f"{tmp_path}/checkpoints/best/ckpt-1"
