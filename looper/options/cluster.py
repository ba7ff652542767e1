"""Facts about the run's cluster: TF_CONFIG's training tasks, the coordination
leader, this task's index, a TPU's cores and the batch per core.

Synopsis::

    cluster.size()                  # training tasks in TF_CONFIG (0: unset)
    cluster.coordination_leader()   # "/job:chief/replica:0/task:0" or None
    cluster.bound_waits(60.0)       # before MultiWorkerMirroredStrategy
    cluster.task_id(strategy)       # this worker's index
    cluster.tpu_batch_warning(32, 8)  # the fix for 4 examples per core

looper.options.distribute builds the strategy from these; the Run, the
command line and the TPU check read them. Apart from `bound_waits` (which
configures TensorFlow's coordination service) nothing here changes state.
"""

import os

import ml_collections
import tensorflow as tf

from looper import compat
from looper.errors import ConfigError


def tasks() -> dict:
  """TF_CONFIG's training jobs, the chief's first: {job: its tasks}, as
  TensorFlow's TFConfigClusterResolver reads them ({} when it is unset).
  An evaluator (or parameter server) task does not make training
  multi-worker."""
  if not os.environ.get("TF_CONFIG"):  # set but empty is unset too
    return {}
  try:
    spec = tf.distribute.cluster_resolver.TFConfigClusterResolver(
    ).cluster_spec().as_dict()
  except (ValueError, AttributeError, TypeError):
    raise ConfigError(
        f"TF_CONFIG={os.environ.get('TF_CONFIG')!r} is not a JSON object"
        " with 'cluster' and 'task'; fix or unset the TF_CONFIG environment"
        " variable") from None
  return {job: spec[job] for job in ("chief", "worker") if spec.get(job)}


def size() -> int:
  """How many training tasks TF_CONFIG describes (0 when it is unset)."""
  return sum(len(tasks) for tasks in tasks().values())


def coordination_leader() -> str | None:
  """The task that runs the coordination service: the first of TF_CONFIG's
  first job (the chief). A worker that loses it loses the cluster. None
  outside multi-worker."""
  if size() == 0:
    return None
  return f"/job:{next(iter(tasks()))}/replica:0/task:0"


def bound_waits(timeout_secs: float) -> None:
  """Makes a missing or unreachable worker an error, not an endless wait.

  By default MultiWorkerMirroredStrategy waits (for an hour or more) for
  every task to register, and a collective whose peer's host went silent
  (a cut link: no reset arrives) waits until heartbeats time out. The
  coordination service bounds both, registration with a barrier that names
  the missing tasks, heartbeats with their timeout; both follow
  `distribution.worker_timeout_secs`, so a silent host ends the run within
  about that time, and a link back well within it (a blip) does not. Only
  TensorFlow's internal context can set them (no public API or environment
  variable exists: compat.configure_coordination_service), before the
  strategy is built.
  """
  compat.configure_coordination_service(
      leader=coordination_leader(),
      jobs={job: len(tasks) for job, tasks in tasks().items()},
      register_timeout_ms=int(timeout_secs * 1000),
      # Measured: the service notices missed heartbeats up to about twice
      # their timeout late (20 s for 8 s); half keeps a cut within it.
      heartbeat_timeout_ms=int(timeout_secs * 500))


def task_id(strategy: tf.distribute.Strategy) -> int:
  """This worker's index (0 outside multi-worker)."""
  resolver = getattr(strategy, "cluster_resolver", None)
  return getattr(resolver, "task_id", None) or 0


def tpu_cores(strategy: tf.distribute.Strategy,
              dist: ml_collections.ConfigDict) -> int:
  """TPU cores the run has (its replicas on a TPU), else the dry-run count
  `distribution.tpu_cores` (0: not a TPU run)."""
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return strategy.num_replicas_in_sync
  return dist.tpu_cores


def tpu_batch_warning(batch_size: int, cores: int) -> str | None:
  """What is wrong with the batch per TPU core, if anything, and the fix.

  A TPU core pads every batch dimension to a multiple of 8 (its matrix
  unit's tiles), so a per-core batch below 8 or off a multiple of 8 wastes
  the padding; the TPU guides use 128 per core.
  """
  per_core = batch_size / cores
  if per_core >= 8 and per_core == int(per_core) and per_core % 8 == 0:
    return None
  good = cores * max(8, 8 * round(per_core / 8))
  return (f"config.train.batch_size={batch_size} gives {per_core:g}"
          f" examples per TPU core ({cores} cores); a core pads to a multiple"
          f" of 8, so set --config.train.batch_size={good} (the TPU guides"
          f" use 128 per core: {128 * cores})")
