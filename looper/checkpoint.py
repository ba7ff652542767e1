"""Saving and restoring the training state; the run loop decides when.

Synopsis::

    ckpt = checkpoint.Checkpointer(f"{workdir}/checkpoints",
                                   trainer.checkpoint_items(), keep=3,
                                   chief=True, task_id=0)
    ckpt.restore()          # latest checkpoint, if any -> its path or None
    ckpt.save(step=500)     # writes checkpoints/ckpt-500.*

What is saved: the model, the optimizer (slots and iteration count), the
global step and the train data position (global examples consumed). The
distributed iterator itself cannot be checkpointed under tf.distribute
(tensorflow#56372); the position restores it exactly (see looper.data).

A checkpoint is never half-written: TensorFlow writes the data to temporary
files and renames them, and the `checkpoint` index that names the latest one
is replaced atomically after that; a crash mid-save leaves the previous
checkpoint as the latest.

Under multi-worker every task must call `save` (it is a collective), but
only the chief's copy is kept: the others write to a scratch directory that
is removed right after.
"""

import os
from typing import Any

from absl import logging
import tensorflow as tf


class Checkpointer:
  """A CheckpointManager over the trainer's state, chief-aware."""

  def __init__(self, directory: str, items: dict[str, Any], *, keep: int,
               chief: bool, task_id: int):
    self.directory = directory
    self._checkpoint = tf.train.Checkpoint(**items)
    self._save_dir = directory if chief else os.path.join(
        os.path.dirname(directory), f".worker{task_id}_checkpoints")
    self._chief = chief
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, self._save_dir, max_to_keep=keep)

  def latest(self) -> str | None:
    """Path prefix of the newest complete checkpoint, or None."""
    return tf.train.latest_checkpoint(self.directory)

  def restore(self) -> str | None:
    """Restores the newest checkpoint; returns its path (None: fresh start)."""
    path = self.latest()
    if path:
      self._checkpoint.restore(path).assert_existing_objects_matched()
      logging.info("Restored %s", path)
    return path

  def save(self, step: int) -> None:
    path = self._manager.save(checkpoint_number=step)
    if self._chief:
      logging.info("Saved %s", path)
    else:
      tf.io.gfile.rmtree(self._save_dir)
