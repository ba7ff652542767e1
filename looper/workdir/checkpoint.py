"""Saving and restoring the training state; the Controller decides when.

Synopsis::

    ckpt = checkpoint.Checkpointer(workdir.Workdir("/tmp/run"),
                                   trainer.checkpoint_items(), keep=3,
                                   chief=True, task_id=0, async_save=False)
    ckpt.restore()          # latest readable checkpoint -> its path or None
    ckpt.save(step=500)     # writes checkpoints/ckpt-500.*
    ckpt.save_best(500)     # checkpoints/best/ckpt-500.* (keeps one)
    ckpt.wait()             # an async save in flight is durable after this
    ckpt.durable_step       # the step of the newest complete save (or
                            # restore): what experiment trackers may send

What is saved: the model, the optimizer (slots and iteration count), the
global step, the train data position (global examples consumed) and the
model's random state (Keras' SeedGenerators: looper.train.randomness). The
distributed iterator itself cannot be checkpointed under tf.distribute
(tensorflow#56372); the position restores it exactly (see looper.data).

A checkpoint is never half-written: TensorFlow writes the data to temporary
files and renames them, and the `checkpoint` index that names the latest one
is replaced atomically after that; a crash mid-save leaves the previous
checkpoint as the latest. With `async_save` TensorFlow writes in a thread
(`experimental_enable_async_checkpoint`): one save is in flight at most, the
next save, `wait()` and a stop wait for it, and the index moves only once
the files are complete. A newest checkpoint that cannot be read (a disk
fault) is skipped with a warning for the one before it.

A save the storage refuses (full, over quota, read-only) leaves nothing
and ends in the one line every writer's refusal ends in
(looper.workdir.files.full_disk), with the size the save needs; an async
one at the next save or `wait()`.

Under multi-worker every task must call `save` (it is a collective), but
only the chief's copy is kept: the others write to a scratch directory
(`Workdir.checkpoint_saves(task_id)`) that is removed once the write is
complete.

The `checkpoint` block is declared here (`config()`) and checked here
(`check`); looper.config composes it.
"""

import contextlib
import os
from typing import Any, Callable

from absl import logging
import ml_collections
import tensorflow as tf

from looper import compat
from looper import fields
from looper import workdir as workdir_lib
from looper.workdir import contents
from looper.workdir import files
from looper.errors import CheckpointError
from looper.errors import CheckpointMissing
from looper.errors import first_line
from looper.options import best

# Items a workdir written by an earlier looper lacks, and what restoring
# without them means: the rest restores and the run goes on, said once.
ADDED_LATER = {
    "random": "the model's random layers' state, so their draws start"
              " again from their seeds (exact resume holds from the next"
              " checkpoint on)",
    "recent_losses": "the recent steps' losses train.spike_factor compares"
                     " with, so spikes are looked for again after a few"
                     " steps",
    "callbacks": "config.callbacks' state (looper.control.callbacks), so"
                 " their epochs, counts and learning-rate scale start over",
}


def config() -> ml_collections.ConfigDict:
  """The `checkpoint` block: each field's default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # Save every this many steps, or epochs; both 0: only at the end (and on
  # a stop). Set one, the other 0 (IN_EPOCHS).
  c.every_steps = fields.whole(0, low=0)
  c.every_epochs = fields.epochs()
  c.keep = fields.whole(3)
  # Also save when this long has passed since the last save (0: off), so a
  # preemptible job loses at most this much work whatever the step time.
  c.every_secs = fields.seconds(0)
  # Write checkpoints in a background thread (TensorFlow's async saving);
  # not `async`, a Python keyword (`c.checkpoint.async` would not parse).
  c.async_save = fields.boolean(False)
  # Keep the checkpoint with the best value of this eval metric ('accuracy',
  # a set's 'val/accuracy', 'loss' with best_mode='min') in checkpoints/best/.
  c.best_metric = ""
  c.best_mode = "max"  # max | min
  # A training run holds workdir/lease.json while it writes (looper.workdir.lease):
  # a second writer is refused. A holder on another host that has not
  # renewed it (every lease_secs / 4) for this long is taken to be gone.
  c.lease_secs = fields.seconds(60, positive=True)
  return c


def check(c: ml_collections.ConfigDict) -> None:
  """The `checkpoint` block's own rules; ConfigError on the first."""
  fields.check_declared(c, "checkpoint")
  fields.check_choice(c.best_mode, "checkpoint.best_mode", best.BEST_MODES)


def io_device(on_tpu: bool, directory: str) -> str | None:
  """Where checkpoint files are read and written from.

  A TPU worker cannot reach the host's local disk: a local workdir must be
  written through the host ('/job:localhost'). Cloud paths (gs://...) are
  reached by the TPU workers themselves, so they get no device.
  """
  return "/job:localhost" if on_tpu and "://" not in directory else None


class Checkpointer:
  """A CheckpointManager over the trainer's state, chief-aware."""

  def __init__(self, workdir: workdir_lib.Workdir, items: dict[str, Any], *,
               keep: int, chief: bool, task_id: int, async_save: bool = False,
               on_tpu: bool = False, guard: Callable[[], None] | None = None):
    self.directory = workdir.checkpoints  # what restore reads
    self._workdir = workdir.root
    # Called before each save; raises to stop a run that must not write
    # (another run took the workdir over: looper.workdir.lease).
    self._guard = guard or (lambda: None)
    self._items = items
    self._checkpoint = tf.train.Checkpoint(**items)
    self._save_dir, self._best_dir = workdir.checkpoint_saves(
        None if chief else task_id)
    self._chief = chief
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, self._save_dir, max_to_keep=keep)
    self._best = None  # a manager for checkpoints/best, made on first use
    device = io_device(on_tpu, self.directory)
    self._sync_options = tf.train.CheckpointOptions(
        experimental_io_device=device)
    self._options = tf.train.CheckpointOptions(
        experimental_io_device=device,
        experimental_enable_async_checkpoint=async_save)
    self._async = async_save
    if async_save:
      compat.patch_keras_async_copy()
    self._pending = None  # the path of an async save in flight
    self._saved_step = None
    # The step of the newest save known complete, or of the restore: an
    # async save's once `wait` saw it end (looper.trackers send up to it).
    self.durable_step = None

  def latest(self) -> str | None:
    """Path prefix of the newest complete checkpoint, or None."""
    return tf.train.latest_checkpoint(self.directory)

  def kept(self) -> str | None:
    """The newest complete checkpoint once a save in flight has ended: what
    a failure's line names (a background save ends before the process
    does). A failed save is not kept: its line is logged, the older named."""
    try:
      self.wait()
    except CheckpointError as e:
      logging.warning("%s", e)
    return self.latest()

  def all(self) -> list[str]:
    """Complete checkpoints in the directory, oldest first."""
    state = tf.train.get_checkpoint_state(self.directory)
    if not state:
      return []
    return [p for p in state.all_model_checkpoint_paths
            if tf.io.gfile.exists(p + ".index")]

  def restore(self, path: str | None = None) -> str | None:
    """Restores `path`, or the newest readable checkpoint; returns its path.

    Returns None when there is no checkpoint (a fresh start).

    Raises:
      CheckpointError: `path` does not exist, no checkpoint is readable, or
        the checkpoint belongs to a different model.
    """
    self.wait()  # a save in flight would be the newest checkpoint
    if path is not None:
      try:
        self._read(path)
      except tf.errors.OpError:
        if tf.io.gfile.exists(path + ".index"):
          raise
      if not tf.io.gfile.exists(path + ".index"):
        # Also when `keep` deleted it while it was being read.
        raise CheckpointMissing(
            f"--checkpoint={path}: no such checkpoint ({path}.index is"
            f" missing); give a prefix like {self.directory}/ckpt-1000")
      return path
    candidates = self.all()
    latest = self.latest()
    if latest and latest not in candidates:
      candidates.append(latest)
    for i, candidate in enumerate(reversed(candidates)):
      try:
        self._read(candidate)
      # A damaged file fails in TensorFlow's reader (OpError) or, cut short,
      # in its Python side ("Read less bytes than requested": IndexError).
      except (tf.errors.OpError, IndexError, EOFError) as e:
        older = candidates[-2 - i] if i + 2 <= len(candidates) else None
        if older is None:
          raise CheckpointError(
              f"checkpoint {candidate} cannot be read"
              f" ({first_line(e)}); delete {candidate}.* (and its line in"
              f" {self.directory}/checkpoint) or use a new --workdir"
              ) from None
        logging.warning("Checkpoint %s cannot be read (%s); falling back to"
                        " %s. Delete %s.* to silence this.", candidate,
                        first_line(e), older, candidate)
        continue
      logging.debug("Restored %s", candidate)  # the run's header says so
      return candidate
    return None

  def _read(self, path: str) -> None:
    checkpoint = self._checkpoint
    lacking = [k for k in ADDED_LATER
               if k in self._items and k not in contents.items(path)]
    if lacking:
      checkpoint = tf.train.Checkpoint(**{
          k: v for k, v in self._items.items() if k not in lacking})
    try:
      checkpoint.restore(
          path, options=self._sync_options).assert_existing_objects_matched()
    except (ValueError, AssertionError) as e:
      raise CheckpointError(
          f"{path} holds a different model or trainer state than the config"
          f" builds ({first_line(e)}); use a new --workdir, or delete"
          f" {self._workdir} to start over") from None
    self._saved_step = self.durable_step = _step_of(path)
    for item in lacking:
      logging.warning("%s was written without %s.", path, ADDED_LATER[item])

  def save(self, step: int, *, sync: bool = False, force: bool = False
           ) -> str | None:
    """Saves the state as `ckpt-{step}`, unless that is the newest already.

    Args:
      step: the global step (names the checkpoint).
      sync: write now even if async saving is on (a preemption save).
      force: write even if `ckpt-{step}` is the newest: the state changed
        without a step (a NaN roll-back moved the data position).
    """
    self.wait()
    if self._saved_step == step and not force:
      return None
    self._guard()
    background = self._async and not sync
    with self._saving(self._save_dir, step):
      path = self._manager.save(
          checkpoint_number=step,
          options=self._options if background else self._sync_options)
    self._saved_step = step
    if background:
      self._pending = path
    else:
      self._finish(path)
      self.durable_step = step
    return path

  def save_best(self, step: int) -> str:
    """Saves the state to `best/ckpt-{step}`, replacing the previous best."""
    self.wait()
    self._guard()
    if self._best is None:
      self._best = tf.train.CheckpointManager(self._checkpoint,
                                              self._best_dir, max_to_keep=1)
    with self._saving(self._best_dir, step):
      path = self._best.save(checkpoint_number=step,
                             options=self._sync_options)
    self._finish(path)
    return path

  @contextlib.contextmanager
  def _saving(self, directory: str, step: int):
    """A save of `ckpt-{step}` into `directory`: if it fails, see `_failed`."""
    try:
      yield
    except (tf.errors.OpError, OSError) as e:
      self._failed(os.path.join(directory, f"ckpt-{step}"), e)
      raise

  def _failed(self, prefix: str, e: BaseException) -> None:
    """Removes what the failed save of `prefix` wrote; raises the one line
    (errors.DiskFull) if the storage refused it, else returns."""
    _discard(prefix)
    directory = os.path.dirname(prefix)

    def needed():  # the same state saves to about the size of the last save
      last = tf.train.latest_checkpoint(directory) or self.latest()
      return None if not last else (
          sum(tf.io.gfile.stat(p).length
              for p in tf.io.gfile.glob(last + ".*")),
          f"the size of {os.path.basename(last)}")
    line = files.full_disk(e, directory,
                           writing=f"checkpoint {os.path.basename(prefix)}",
                           checkpoints=self.directory, needed=needed)
    if line is not None:
      raise line from None

  def wait(self) -> None:
    """Blocks until an async save is complete; raises if its write failed.

    TensorFlow's `sync()` does not raise a failed background write (it
    would surface only at the next save, or be lost at exit), so the error
    is fetched here, and the index must name the checkpoint just written.
    """
    if self._pending is None:
      return
    path, self._pending = self._pending, None
    self._checkpoint.sync()
    error = None
    try:
      compat.raise_async_save_error(self._checkpoint)
    except Exception as e:  # pylint: disable=broad-except
      self._failed(path, e)  # a full disk: its own line
      error = first_line(e)
    if error is None and tf.train.latest_checkpoint(self._save_dir) != path:
      error = f"{self._save_dir}/checkpoint does not name it"
    if error is not None:
      raise CheckpointError(
          f"the background save of {path} failed ({error}); the newest"
          f" complete checkpoint is {tf.train.latest_checkpoint(self.directory)};"
          " check the disk, or set --config.checkpoint.async_save=False")
    self._finish(path)
    self.durable_step = _step_of(path)

  def _finish(self, path: str) -> None:
    if self._chief:
      logging.info("Saved %s", path)
    else:
      tf.io.gfile.rmtree(self._save_dir)


def _step_of(path: str) -> int | None:
  tail = path.rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else None


def _discard(prefix: str) -> None:
  """Removes what a failed save of `prefix` wrote: `<prefix>_temp/`, the
  files if the index does not name them, the index's `checkpoint.tmp<hex>`.
  A store refusing this too is only logged: the save's error is reported."""
  directory = os.path.dirname(prefix)
  try:
    state = tf.train.get_checkpoint_state(directory)
    paths = (tf.io.gfile.glob(prefix + "_temp*") +
             tf.io.gfile.glob(os.path.join(directory, "checkpoint.tmp*")))
    if not state or prefix not in state.all_model_checkpoint_paths:
      paths += tf.io.gfile.glob(prefix + ".*")
    for path in paths:
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)
  except (tf.errors.OpError, OSError) as e:
    logging.warning("Could not remove what the failed save of %s wrote: %s",
                    prefix, first_line(e))

