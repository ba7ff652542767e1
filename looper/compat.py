"""Every private TensorFlow or Keras API looper uses, one function each.

Synopsis::

    compat.after_all_reduce(optimizer, clip)     # optimizers.after_sum
    compat.uses_weight_decay(optimizer, v)       # sharding: AdamW's
    compat.all_gather(tensor)                    # sharding: ONE collective
    compat.saved_as_variable(save, restore)      # sharded: saved whole
    compat.optimizer_layout(optimizer, weights, stand_ins)  # its slots so
    compat.in_multi_worker_mode(strategy)        # the endless train stream
    compat.configure_coordination_service(leader=..., jobs=..., ...)  # MWMS
    compat.disable_op_determinism()              # precision.set_deterministic
    compat.patch_keras_async_copy()              # checkpoint, async saves
    compat.raise_async_save_error(tf_checkpoint)  # checkpoint.wait
    compat.mark_expected_partial(value)          # console, a failed restore
    compat.dataset_graph(dataset)                # tpu_check: Python in tf.data
    compat.function_graphs(graph)                # tpu_check: loop bodies
    compat.function_graph(graph, name)           # flops: a call's graph
    compat.on_gce()                              # notices: a GCE VM?
    compat.ask_dispatcher("host:5050", "GetWorkers", 60)  # data.service start
    compat.shared_value("key", "value" or None)  # one job name, all workers

Each reaches into a name TensorFlow or Keras may move in any release (no
public API does it); its docstring says what it touches, why, and the
versions it was checked on (CHECKED_ON). tests/unit/floor/test_compat.py
fails when one moves (name, signature, behaviour where cheap to check):
after an upgrade run it first, then update CHECKED_ON and the docstrings.
Keras' private layer and metric internals are in looper.keras_compat.

Private modules are imported inside the function that needs them, so a
moved one breaks only that feature. Nothing here imports from looper.
"""

import contextlib
from typing import Callable

import tensorflow as tf

# The versions every function below was checked on (each docstring says so).
CHECKED_ON = {"tensorflow": "2.21.0", "keras": "3.15.1"}

GradsAndVars = list[tuple[tf.Tensor | tf.IndexedSlices | None, tf.Variable]]


def after_all_reduce(optimizer,
                     transform: Callable[[GradsAndVars], GradsAndVars]) -> None:
  """Makes `optimizer` pass the gradients it summed over the replicas
  through `transform` before it applies them. Touches: Keras' TF
  optimizer's `_all_reduce_sum_gradients(grads_and_vars)` (replica
  context), replaced on the instance (under loss scaling the inner one's:
  it sums gradients unscaled and known finite). Why: clip_global_norm clips
  the sum (Keras' clipnorm: each replica's), the health figures log its
  norm, sharding keeps a slice of it: no public hook.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  target = getattr(optimizer, "inner_optimizer", optimizer)
  all_reduce = target._all_reduce_sum_gradients  # pylint: disable=protected-access
  target._all_reduce_sum_gradients = (  # pylint: disable=protected-access
      lambda grads_and_vars: transform(all_reduce(grads_and_vars)))


def uses_weight_decay(optimizer, variable) -> bool:
  """Whether `optimizer` decays `variable`. Touches: Keras' `BaseOptimizer.
  _use_weight_decay(variable)`. Why: sharding decides for a weight's shard
  as for the weight. Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  return optimizer._use_weight_decay(variable)  # pylint: disable=protected-access


def all_gather(tensor: tf.Tensor) -> tf.Tensor:
  """`tensor` of every replica end to end on axis 0 (replica context; one
  shape on all) by ONE collective. Touches: the launchers of a collective
  cross-device ops, `._launchers[i]._all_gather`, in a merge call: Mirrored's
  `extended._collective_ops` (its XLA path's; its GPU default, NCCL's ops,
  has no gather), else `extended._get_cross_device_ops(value)` (multi-
  worker's). Why: `ReplicaContext.all_gather` gathers the shapes first, pads
  and unpads: 3 ms of a 21 ms step. Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  from tensorflow.python.distribute import values  # pylint: disable=g-import-not-at-top

  def gather(strategy, value):
    ops = (getattr(strategy.extended, "_collective_ops", None) or
           strategy.extended._get_cross_device_ops(value))  # pylint: disable=protected-access
    return values.PerReplica(tuple(
        launcher._all_gather(part, None)  # pylint: disable=protected-access
        for launcher, part in zip(ops._launchers,  # pylint: disable=protected-access
                                  strategy.experimental_local_results(value))))
  return tf.distribute.get_replica_context().merge_call(gather, args=(tensor,))


def saved_as_variable(save: Callable[[], tf.Tensor],
                      restore: Callable[[tf.Tensor], None]):
  """A checkpoint item saved as a variable holding `save()`; its restore
  calls `restore(tensor)`. Touches: the Trackable protocol (`_serialize_to_
  tensors`, `_restore_from_tensors`, `_copy_trackable_to_cpu`). Why: sharded
  slots are saved whole. Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  from tensorflow.python.trackable import base  # pylint: disable=g-import-not-at-top
  key = base.VARIABLE_VALUE_KEY

  class Whole(base.Trackable):  # saved as a variable is
    def _serialize_to_tensors(self):
      return {key: tf.convert_to_tensor(save())}
    def _restore_from_tensors(self, restored_tensors):
      return restore(restored_tensors[key])
    def _copy_trackable_to_cpu(self, object_map):
      if self in object_map:
        object_map[self].assign(save())
      else:
        with tf.device("/cpu:0"):
          object_map[self] = tf.Variable(save(), trainable=False)
  return Whole()


def optimizer_layout(optimizer, weights, stand_ins: dict):
  """A checkpoint item with `optimizer`'s keys: `weights` for the variables
  it was built on; for its variable v, `stand_ins[id(v)]` if there, else
  v. Touches: Keras' optimizer's `_trackable_children()`. Why: one built on
  shards saves its slots whole. Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  from tensorflow.python.trackable import autotrackable  # pylint: disable=g-import-not-at-top
  layout = autotrackable.AutoTrackable()
  for name, child in optimizer._trackable_children().items():  # pylint: disable=protected-access
    if name == "_trainable_variables":
      setattr(layout, name, list(weights))
    elif isinstance(child, list):  # a ListWrapper too
      setattr(layout, name, [stand_ins.get(id(v), v) for v in child])
    elif hasattr(child, "assign"):  # a variable
      setattr(layout, name, stand_ins.get(id(child), child))
  return layout


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` trains across several worker processes. Touches:
  `strategy.extended._in_multi_worker_mode()`: True only for a multi-worker
  MultiWorkerMirroredStrategy (a TPU pod's is False). Why: the train stream
  is endless only where tf.distribute asks every worker at each get_next
  whether it has data; sharding gathers a slot by a collective there.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  return strategy.extended._in_multi_worker_mode()  # pylint: disable=protected-access


def configure_coordination_service(*, leader: str, jobs: dict[str, int],
                                   register_timeout_ms: int,
                                   heartbeat_timeout_ms: int) -> None:
  """Sets the multi-worker coordination service's limits, before the
  strategy is built: `jobs` ({job: number of tasks}) register with `leader`
  behind a barrier within `register_timeout_ms`, and a task whose
  heartbeats stop for `heartbeat_timeout_ms` fails the others.

  Touches: the eager context's `configure_coordination_service(...)` with
  CoordinatedJob protos (tsl coordination_config_pb2) and the stored
  config's `cluster_register_with_barrier`, which its ConfigProto carries
  to the server; MultiWorkerMirroredStrategy keeps what was set before it.
  Why: by default a missing worker is waited for an hour or more, a silent
  peer until heartbeats time out; no public API or environment variable
  sets either (without the barrier the leader waits regardless).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  ctx = context.context()
  ctx.configure_coordination_service(
      service_type="standalone", service_leader=leader,
      cluster_register_timeout_in_ms=register_timeout_ms,
      heartbeat_timeout_in_ms=heartbeat_timeout_ms,
      coordinated_jobs=[coordination_config_pb2.CoordinatedJob(
          name=job, num_tasks=tasks) for job, tasks in jobs.items()])
  ctx.coordination_service.cluster_register_with_barrier = True


def disable_op_determinism() -> None:
  """Turns TensorFlow's op determinism off (the default).

  Touches: tensorflow.python.framework.config.disable_op_determinism();
  only `tf.config.experimental.enable_op_determinism` is public.
  Why: `train.deterministic=False` undoes an earlier deterministic run in
  the process (op determinism refuses `tf.timestamp`, which times input).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.framework import config  # pylint: disable=g-import-not-at-top
  config.disable_op_determinism()


def patch_keras_async_copy() -> None:
  """Lets TensorFlow's async checkpointing copy Keras 3 variables more than
  once (idempotent; the checkpoint format is unchanged).

  Touches: `_copy_trackable_to_cpu(self, object_map)` of Keras' TensorFlow
  Variable, replaced on the class by the wrapped tf.Variable's.
  Why: Keras' makes a new CPU tf.Variable in a tf.function on every save:
  the second async save fails ("tf.function only supports singleton
  tf.Variables created on the first call"); tf.Variable's copies in place.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from keras.src.backend.tensorflow import core  # pylint: disable=g-import-not-at-top
  if getattr(core.Variable, "_looper_async_patch", False):
    return

  def copy_to_cpu(self, object_map):
    self.value._copy_trackable_to_cpu(object_map)  # pylint: disable=protected-access
    object_map[self] = object_map[self.value]

  core.Variable._copy_trackable_to_cpu = copy_to_cpu  # pylint: disable=protected-access
  core.Variable._looper_async_patch = True  # pylint: disable=protected-access


def raise_async_save_error(checkpoint: tf.train.Checkpoint) -> None:
  """Raises the error of `checkpoint`'s last background write, if it
  failed (call after `checkpoint.sync()`).

  Touches: the Checkpoint's `_async_checkpointer_impl` (None before its
  first async save) and its `_check_async_thread_error()`. Why: `sync()`
  does not raise a failed background write (the next save would, or none).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  helper = checkpoint._async_checkpointer_impl  # pylint: disable=protected-access
  if helper is not None:
    helper._check_async_thread_error()  # pylint: disable=protected-access


def mark_expected_partial(value) -> bool:
  """Marks `value` expected-partial if it is TensorFlow's record of a
  checkpoint restore; returns whether it was one.

  Touches: checkpoint._CheckpointRestoreCoordinator's `expect_partial`
  (what the public `status.expect_partial()` sets).
  Why: a failed restore (another model's workdir) raises before returning
  the status; its record, kept by the traceback's frames, logs "deleted
  with unrestored values" at exit, after looper's one line, unless marked.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.checkpoint import checkpoint  # pylint: disable=g-import-not-at-top
  if not isinstance(value, checkpoint._CheckpointRestoreCoordinator):  # pylint: disable=protected-access
    return False
  value.expect_partial = True
  return True


def dataset_graph(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
  """The GraphDef of `dataset`'s whole pipeline, its functions included.
  Touches: `tf.data.Dataset._as_serialized_graph()`. Why: `looper check`
  names the ops that call back into Python, which a TPU host cannot run;
  no public view. Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  return tf.compat.v1.GraphDef.FromString(
      dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access


def function_graphs(graph) -> list:
  """The graphs of the functions defined in `graph` (a FuncGraph): the
  bodies and conditions of its while loops and branches of its conds.
  Touches: `FuncGraph._functions` ({name: AtomicFunction}), their `graph`.
  Why: `looper check` finds ops with data-dependent shapes inside loops too
  (a train loop's body); no public list.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1."""
  bodies = (getattr(f, "graph", None) for f in graph._functions.values())  # pylint: disable=protected-access
  return [body for body in bodies if body is not None]


def function_graph(graph, name: str):
  """The traced graph (FuncGraph) of the function `name` an op of `graph`
  calls (a while loop's body, a cond's branch, a tf.function), or None.

  Touches: `Graph._get_function(name)` (an AtomicFunction) and its `graph`.
  Why: looper.measure.flops counts a step's FLOPs in the loop's body and the
  functions it calls, with shapes (`graph.as_graph_def()` has none); no
  public API maps a call to its graph.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return getattr(graph._get_function(name), "graph", None)  # pylint: disable=protected-access


def on_gce() -> bool:
  """Whether this process runs on a Google Compute Engine VM (a Cloud TPU
  VM is one), decided as TensorFlow's preemption handler decides it.

  Touches: `on_gcp()` of failure_handling_util (what
  PreemptionCheckpointHandler's `detect_platform` asks): one GET of
  `http://$GCE_METADATA_IP/computeMetadata/v1/instance/hostname`
  (metadata.google.internal when unset), `Metadata-Flavor: Google`, 5 s
  timeout; True on status 200, False otherwise or on any requests error.
  Why: looper watches the metadata server's preemption and maintenance
  notices (looper.control.vm_notices) where TensorFlow would; no public API.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.distribute.failure_handling import failure_handling_util  # pylint: disable=g-import-not-at-top
  return failure_handling_util.on_gcp()


def ask_dispatcher(address: str, method: str, timeout_secs: float) -> bytes:
  """Calls `method` of the tf.data service dispatcher at `address`
  (HOST:PORT) with an empty request, waiting up to `timeout_secs` for it
  to come up; returns the serialized response.

  Touches: the dispatcher's gRPC service `tensorflow.data.DispatcherService`
  (dispatcher.proto; rpc `GetVersion`, `GetWorkers`) through grpcio,
  without TF's protos: b'' (an empty GetWorkersResponse) is no worker.
  Raises grpc.RpcError: DEADLINE_EXCEEDED (no answer), UNIMPLEMENTED
  (another gRPC server answered: a service worker's port).
  Why: tf.data's service waits an hour for a silent dispatcher, forever
  for a worker (no timeout); looper's check names what is missing at once.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  import grpc  # pylint: disable=g-import-not-at-top
  with grpc.insecure_channel(address) as channel:
    call = channel.unary_unary(f"/tensorflow.data.DispatcherService/{method}")
    return call(b"", timeout=timeout_secs, wait_for_ready=True)


def shared_value(key: str, value: str | None) -> str:
  """Sets `key` to `value` in the multi-worker coordination service's
  key-value store (value given: the chief), or waits until a worker set it
  and returns it (value None).

  Touches: the eager context's `set_config_key_value(key, value)` and
  `get_config_key_value(key)`: the coordination service of every
  MultiWorkerMirroredStrategy process (as TF's preemption handler).
  Why: all workers read one tf.data service job, named afresh by the chief
  for each attempt; no public API shares a string between the workers.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  if value is not None:
    context.context().set_config_key_value(key, value)
    return value
  return context.context().get_config_key_value(key)
