"""The tf.distribute strategy a config asks for.

Synopsis::

    strategy = distribute.strategy_for(config.distribution)  # before any TF op
    with strategy.scope(): ...
    if strategy.extended.should_checkpoint: write_files()  # the chief

`distribution.strategy`:
  auto          tpu if `distribution.tpu` is set; multi_worker if TF_CONFIG
                names more than one task (under `srun` with several tasks,
                looper.options.slurm writes it from Slurm's environment);
                mirrored if there are several GPUs or `num_cpu_devices` > 1;
                else default.
  default       tf.distribute's default (no-op) strategy.
  one_device    OneDeviceStrategy on the first GPU, else the CPU.
  mirrored      MirroredStrategy over all GPUs, else over `num_cpu_devices`
                logical CPUs (how multi-replica code runs on a laptop).
  multi_worker  MultiWorkerMirroredStrategy from TF_CONFIG; its all-reduce
                is `distribution.all_reduce` (`communication`): auto is
                NCCL when the workers have GPUs, else ring. Its server
                starts only within `distribution.network` (`check_reach`).
  tpu           TPUClusterResolver(tpu=...), connect, initialize, TPUStrategy.

Every GPU's memory grows as needed (`grow_gpu_memory`) rather than being
taken whole at start, so several looper processes can share a GPU. A
process with one CPU gets a second inter-op thread (`two_op_threads`).

tf.distribute is the only engine: this module only chooses and builds.
The `distribution` block is declared (`config()`) and checked (`check`)
here: STRATEGIES (name -> builder) is the list `distribution.strategy`
is checked against, with 'auto'; ALL_REDUCES the names of
`distribution.all_reduce`.
"""

import os

from absl import logging
import ml_collections
import tensorflow as tf

from looper import fields
from looper import network
from looper.errors import ConfigError
from looper.options import cluster
from looper.options import slurm


def choose(dist: ml_collections.ConfigDict, num_gpus: int) -> str:
  """Resolves `distribution.strategy='auto'` to a concrete strategy name."""
  if dist.strategy != "auto":
    return dist.strategy
  if dist.tpu:
    return "tpu"
  if cluster.size() > 1:
    return "multi_worker"
  if num_gpus > 1 or dist.num_cpu_devices > 1:
    return "mirrored"
  return "default"


def split_cpu(num_devices: int) -> list[str]:
  """Splits the first CPU into `num_devices` logical devices; returns names.

  Must run before TensorFlow initializes its devices (before any op). Calling
  it again with the same count is fine; another count cannot work in one
  process, so it raises.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  wanted = [tf.config.LogicalDeviceConfiguration()] * num_devices
  try:
    tf.config.set_logical_device_configuration(cpu, wanted)
  except RuntimeError:
    have = len(tf.config.list_logical_devices("CPU"))
    if have != num_devices:
      raise ConfigError(
          f"config.distribution.num_cpu_devices={num_devices}: TensorFlow"
          f" already started with {have} CPU device(s) in this process; set"
          " it once per process, before any TensorFlow op") from None
  return [f"/cpu:{i}" for i in range(num_devices)]


def tpu_strategy(tpu: str) -> tf.distribute.TPUStrategy:
  """Connects to and initializes the TPU system named `tpu`."""
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  return tf.distribute.TPUStrategy(resolver)


def _mirrored(dist: ml_collections.ConfigDict, gpus: list):
  # Devices must be listed: by default Mirrored ignores logical CPUs.
  return mirrored([f"/gpu:{i}" for i in range(len(gpus))] if gpus else
                  split_cpu(dist.num_cpu_devices))


_MIRRORED = {}  # devices -> this process's MirroredStrategy over them


def mirrored(devices: list[str]) -> tf.distribute.MirroredStrategy:
  """The process's MirroredStrategy over `devices`, made once. A second one
  over the same devices numbers its all-reduces from the same collective
  keys as the first, and once both have run they clash (TensorFlow 2.21:
  "Shape mismatch in the collective instance 100"): a notebook or a sweep
  that runs looper twice in one process reuses the first."""
  key = tuple(devices)
  if key not in _MIRRORED:
    _MIRRORED[key] = tf.distribute.MirroredStrategy(list(devices))
  return _MIRRORED[key]


# `distribution.all_reduce`: how multi_worker sums across the workers.
ALL_REDUCES = ("auto", "nccl", "ring")


def communication(all_reduce: str, gpus: list
                  ) -> tf.distribute.experimental.CommunicationOptions:
  """The all-reduce `distribution.all_reduce` names; auto: NCCL between
  GPUs, TensorFlow's AUTO (ring) on CPUs.

  TensorFlow's AUTO would be ring on GPUs too: TensorFlow 2.21 picks NCCL
  only when asked (CollectiveParamResolverLocal::AssignCollectiveType), and
  NCCL is the fast path between GPUs (NVLink within a host). NCCL refuses
  two workers on one GPU ("Duplicate GPU detected"): those need ring.
  """
  kind = tf.distribute.experimental.CommunicationImplementation
  if all_reduce == "auto":
    implementation = kind.NCCL if gpus else kind.AUTO
  else:
    implementation = kind[all_reduce.upper()]
  return tf.distribute.experimental.CommunicationOptions(
      implementation=implementation)


def _multi_worker(dist: ml_collections.ConfigDict, gpus: list):
  if cluster.size() == 0:
    raise ConfigError(
        "config.distribution.strategy='multi_worker' needs TF_CONFIG"
        " naming the cluster and this task; set it, or use 'mirrored'")
  check_reach(dist.network)
  cluster.bound_waits(dist.worker_timeout_secs)
  # On every local GPU; `gpus` only picks the all-reduce.
  return tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=communication(dist.all_reduce, gpus))


def check_reach(reach: str) -> None:
  """Refuses in one line a worker whose server would be open beyond
  `distribution.network` (looper.network): any address of this machine,
  or the one TF_CONFIG names this task at, outside it. Before the server
  starts, which MultiWorkerMirroredStrategy does; `public` says once what
  it opens."""
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  try:
    where = resolver.cluster_spec().task_address(resolver.task_type,
                                                 resolver.task_id)
  except ValueError:
    raise ConfigError(
        f"TF_CONFIG={os.environ.get('TF_CONFIG')!r}: its task (type"
        f" {resolver.task_type!r}, index {resolver.task_id!r}) is not in its"
        " cluster; give it \"task\": {\"type\": \"worker\", \"index\": i},"
        " i this worker's place in the list") from None
  declared = f"config.distribution.network={reach!r}"
  refused = network.refusal(
      reach, network.addresses(), declared=declared,
      flag="--config.distribution.network",
      named=(where, network.resolve(where.rpartition(":")[0])))
  if refused:
    raise ConfigError(refused)
  if reach == "public":
    logging.warning(
        "%s: this worker's TensorFlow server listens on every address of"
        " this machine without authentication: whoever reaches it can run"
        " TensorFlow ops as this process (its files, the run's collectives);"
        " keep a firewall that admits only the run's machines", declared)


# `distribution.strategy` -> fn(config.distribution, physical GPUs).
STRATEGIES = {
    "default": lambda dist, gpus: tf.distribute.get_strategy(),
    "one_device": lambda dist, gpus: tf.distribute.OneDeviceStrategy(
        "/gpu:0" if gpus else "/cpu:0"),
    "mirrored": _mirrored,
    "multi_worker": _multi_worker,
    "tpu": lambda dist, gpus: tpu_strategy(dist.tpu),
}


def config() -> ml_collections.ConfigDict:
  """The `distribution` block: each field's default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # auto, or one of distribute.STRATEGIES; auto picks from the fields below
  c.strategy = "auto"
  c.num_cpu_devices = fields.whole(1)  # >1: split the CPU, mirror over it
  # ZeRO stage 1: 1/N of the optimizer's slots per replica (options/sharding)
  c.shard_optimizer = fields.boolean(False)
  c.tpu = ""  # TPU name or grpc:// address ('local' on a VM)
  # Off a TPU: dry-run its start-up checks for this many cores (0: on a TPU)
  c.tpu_cores = fields.whole(0, low=0)
  # multi_worker: how long a worker waits for the others to come up, and
  # how long one may stay unreachable later (missed heartbeats: a cut link,
  # a lost VM), before the others fail with one line naming it.
  c.worker_timeout_secs = fields.seconds(300, positive=True)
  # multi_worker: how the workers sum gradients (distribute.ALL_REDUCES):
  # auto (NCCL between GPUs, else ring) | nccl | ring. Workers sharing a GPU
  # need ring: NCCL refuses them (`looper launch` sets it when they share).
  c.all_reduce = "auto"
  # multi_worker: who may reach this worker's server, which listens on every
  # address of the machine: network.REACHES (loopback | private | public),
  # checked before it starts. private fits TF_CONFIG's and Slurm's machines;
  # `looper launch` makes it loopback (its workers: 127.0.0.1) unless given.
  c.network = "private"
  return c


def check(dist: ml_collections.ConfigDict) -> None:
  """The `distribution` block's own rules; ConfigError on the first."""
  fields.check_declared(dist, "distribution")
  fields.check_choice(dist.strategy, "distribution.strategy",
                      ("auto", *STRATEGIES))
  fields.check_choice(dist.all_reduce, "distribution.all_reduce", ALL_REDUCES)
  fields.check_choice(dist.network, "distribution.network", network.REACHES)
  fields.check(dist.strategy != "tpu" or bool(dist.tpu), "distribution.tpu",
               dist.tpu, "strategy 'tpu' needs the TPU name or address (use"
               " 'local' on a TPU VM)")


def grow_gpu_memory(gpus: list) -> None:
  """Lets each GPU's memory grow as needed instead of being taken at start.

  By default the first TensorFlow process to use a GPU takes nearly all its
  memory, so a second looper process on the host (a continuous_eval
  evaluator beside training, `looper launch` workers sharing GPUs) finds
  none. Must run before TensorFlow initializes the GPUs (before any op);
  again in the same process it changes nothing.
  """
  for gpu in gpus:
    try:
      tf.config.experimental.set_memory_growth(gpu, True)
    except ValueError:  # the user gave it logical devices: their own limits
      continue
    except RuntimeError:  # an op ran before the run: too late, it still runs
      logging.warning(
          "GPU memory growth not set: TensorFlow started on the GPUs before"
          " the run, so this process keeps the memory it took and another"
          " looper process on them may find none; run no TensorFlow op"
          " before looper's run in this process")
      return


def two_op_threads() -> None:
  """Two inter-op threads in a process that may use one CPU, unless the
  user chose (TF_NUM_INTEROP_THREADS or tf.config.threading).

  TensorFlow sizes the inter-op pool by the CPUs it may use: one thread on
  one CPU. A train call's get_next then waits in line behind the step's
  ops, and the input wait timed around it counts the step: measured 95% on
  a compute-bound run from resident arrays pinned to one CPU, 2% with two
  threads (tests/unit/train/test_input_wait.py). Must run before TensorFlow
  starts.
  """
  cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
          else os.cpu_count())
  if (cpus == 1 and "TF_NUM_INTEROP_THREADS" not in os.environ and
      not tf.config.threading.get_inter_op_parallelism_threads()):
    try:
      tf.config.threading.set_inter_op_parallelism_threads(2)
    except RuntimeError:  # TensorFlow started before the run: it keeps one
      pass


def strategy_for(dist: ml_collections.ConfigDict) -> tf.distribute.Strategy:
  """Builds the strategy the `distribution` block `dist` asks for (see
  module doc)."""
  # Under srun: this task's TF_CONFIG and GPUs, before TensorFlow sees them.
  sharing = slurm.join_step(dist.strategy)
  gpus = tf.config.list_physical_devices("GPU")
  if sharing > 1 and gpus:
    _share_gpus(dist, len(gpus), sharing)
  grow_gpu_memory(gpus)
  two_op_threads()
  if dist.num_cpu_devices > 1:
    split_cpu(dist.num_cpu_devices)
  name = choose(dist, len(gpus))
  logging.debug("distribution.strategy=%r resolved to %r", dist.strategy,
                name)  # the run's header names the strategy
  return STRATEGIES[name](dist, gpus)


def _share_gpus(dist: ml_collections.ConfigDict, num_gpus: int,
                tasks: int) -> None:
  """Tasks of a Slurm step that all use their node's GPUs: ring all-reduce
  (as `looper launch` makes it for workers sharing GPUs: NCCL refuses two
  workers on one GPU), and one line saying so."""
  logging.warning(
      "%d GPU(s) shared by the %d tasks of this node (not an even split):"
      " every task uses all of them (memory grows as needed; ring"
      " all-reduce, as NCCL refuses two workers on one GPU); for one share"
      " each, run srun with --gpus-per-task or a --ntasks-per-node that"
      " divides %d", num_gpus, tasks, num_gpus)
  if dist.all_reduce == "auto":
    dist.all_reduce = "ring"
