"""Saving and restoring the training state; the Controller decides when.

Synopsis::

    ckpt = checkpoint.Checkpointer(workdir.Workdir("/tmp/run"),
                                   trainer.checkpoint_items(), keep=3,
                                   chief=True, task_id=0, async_save=False)
    ckpt.restore()          # latest readable checkpoint -> its path or None
    ckpt.save(step=500)     # writes checkpoints/ckpt-500.*
    ckpt.save_best(500)     # checkpoints/best/ckpt-500.* (keeps one)
    ckpt.wait()             # an async save in flight is durable after this
    checkpoint.warm_start("/runs/a/checkpoints", {"model": model})

What is saved: the model, the optimizer (slots and iteration count), the
global step and the train data position (global examples consumed). The
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
and ends in one line (errors.DiskFull), an async one at the next save or
`wait()`; the run's other writers get the same from `on_full_disk`.

Under multi-worker every task must call `save` (it is a collective), but
only the chief's copy is kept: the others write to a scratch directory
(`Workdir.checkpoint_saves(task_id)`) that is removed once the write is
complete.
"""

import contextlib
import os
from typing import Any, Callable

from absl import logging
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from looper import compat
from looper import errors
from looper import workdir as workdir_lib
from looper.errors import CheckpointError
from looper.errors import CheckpointMissing
from looper.errors import first_line


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

  def latest(self) -> str | None:
    """Path prefix of the newest complete checkpoint, or None."""
    return tf.train.latest_checkpoint(self.directory)

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
    try:
      self._checkpoint.restore(
          path, options=self._sync_options).assert_existing_objects_matched()
    except (ValueError, AssertionError) as e:
      raise CheckpointError(
          f"{path} holds a different model or trainer state than the config"
          f" builds ({first_line(e)}); use a new --workdir, or delete"
          f" {self._workdir} to start over") from None
    self._saved_step = _step_of(path)

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
    if errors.storage_refused(e) is None:
      return
    directory = os.path.dirname(prefix)
    # The same state saves to about the size of the last save.
    last = tf.train.latest_checkpoint(directory) or self.latest()
    needed = None if not last else (
        sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(last + ".*")),
        f"the size of {os.path.basename(last)}")
    raise errors.disk_full(
        directory, e, writing=f"checkpoint {os.path.basename(prefix)}",
        kept=self.latest(), needed=needed) from None

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


@contextlib.contextmanager
def on_full_disk(directory: str, writing: str, checkpoints: str):
  """A write of `writing` ("metrics.jsonl") into `directory` that the
  storage refuses ends in errors.DiskFull, naming the newest checkpoint in
  `checkpoints` (`Workdir.checkpoints`) as kept; other errors pass."""
  try:
    yield
  except (tf.errors.OpError, OSError) as e:
    if errors.storage_refused(e) is None:
      raise
    raise errors.disk_full(directory, e, writing=writing,
                           kept=tf.train.latest_checkpoint(checkpoints)
                           ) from None


def variable_keys(path: str, prefix: str) -> dict[str, str]:
  """{name: checkpoint key} of the variables under `prefix` (e.g. 'model').

  A checkpoint stores each variable once, under the first path that
  reaches it (a model's weights usually sit under `optimizer/`), so the
  names come from walking the object graph from `prefix`: the same names
  for the same model, whatever else the checkpoint holds.
  """
  reader = tf.compat.v1.train.NewCheckpointReader(path)
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  keys, seen = {}, set()

  def walk(node_id: int, name: str):
    seen.add(node_id)
    for attribute in graph.nodes[node_id].attributes:
      if attribute.name == "VARIABLE_VALUE":
        keys[name] = attribute.checkpoint_key
    for child in graph.nodes[node_id].children:
      if child.node_id not in seen:
        walk(child.node_id, f"{name}/{child.local_name}" if name
             else child.local_name)

  for child in graph.nodes[0].children:
    if child.local_name == prefix:
      walk(child.node_id, "")
  return keys


def _shapes(path: str, prefix: str) -> dict[str, list[int]]:
  shapes = tf.compat.v1.train.NewCheckpointReader(
      path).get_variable_to_shape_map()
  return {name: shapes[key] for name, key in variable_keys(path, prefix).items()}


def warm_start(path: str, items: dict[str, Any]) -> str:
  """Restores `items` (e.g. the model) from another run before step 0.

  Variables match by their place in the model (the same keys a checkpoint
  of this model would use); those missing from the checkpoint keep their
  initial values, and one line reports what matched.

  Args:
    path: a checkpoint prefix, or a directory holding checkpoints.
    items: {'model': model} and optionally {'optimizer': optimizer}.

  Returns:
    The one-line report (also logged).

  Raises:
    CheckpointError: no checkpoint at `path`, or a variable's shape differs.
  """
  if tf.io.gfile.isdir(path):
    path = tf.train.latest_checkpoint(path) or path
  if not tf.io.gfile.exists(path + ".index"):
    raise CheckpointError(
        f"config.init.checkpoint={path!r}: no checkpoint there ({path}.index"
        " is missing); give a checkpoint prefix like"
        " /runs/a/checkpoints/ckpt-1000 or its directory")
  # Our own keys, from a throwaway in-memory checkpoint of this model.
  probe = tf.train.Checkpoint(**items).write(f"ram://looper-warm-start/{id(items)}")
  parts = []
  # The optimizer also reaches the model's weights: report those once.
  model_keys = set(variable_keys(probe, "model").values())
  for name in items:
    own = {n for n, k in variable_keys(probe, name).items()
           if name == "model" or k not in model_keys}
    ours = {n: v for n, v in _shapes(probe, name).items() if n in own}
    theirs = {n: v for n, v in _shapes(path, name).items()
              if n in own or n not in _shapes(probe, name)}
    for key, shape in ours.items():
      if key in theirs and theirs[key] != shape:
        raise CheckpointError(
            f"config.init.checkpoint={path!r}: {name} variable {key} has shape"
            f" {theirs[key]} there but {shape} here; make the model match, or"
            " drop the layer from the warm start")
    matched = [k for k in ours if k in theirs]
    missing = [k for k in ours if k not in theirs]
    unused = [k for k in theirs if k not in ours]
    parts.append(f"{name}: {len(matched)} of {len(ours)} variables restored"
                 + (f", not in the checkpoint: {', '.join(missing)}"
                    if missing else "")
                 + (f", unused from it: {', '.join(unused)}" if unused else ""))
  tf.io.gfile.rmtree("ram://looper-warm-start")
  tf.train.Checkpoint(**items).read(path).expect_partial()
  report = f"Warm start from {path}: " + "; ".join(parts)
  logging.info(report)
  return report
