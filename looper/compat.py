"""Every private TensorFlow or Keras API looper uses, one function each.

Synopsis::

    compat.after_all_reduce(optimizer, clip)     # optimizers.after_sum
    compat.in_multi_worker_mode(strategy)        # the endless train stream
    compat.configure_coordination_service(       # distribute, multi-worker
        leader="/job:worker/replica:0/task:0", jobs={"worker": 2},
        register_timeout_ms=60_000, heartbeat_timeout_ms=30_000)
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
    compat.sublayers(model)                      # randomness: nested layers
    compat.seed_generators(layer)                # randomness: their states
    compat.output_operation(model)               # dry_run: the last op
    compat.metric_direction(metric)              # callbacks: mode 'auto'
    with compat.keras_variables_deferred(): ...  # parsing: metric objects

Each function reaches into a name TensorFlow or Keras may move or reshape in
any release, because no public API does what looper needs. Its docstring
says what it touches, why looper needs it, and the versions it was checked
on (CHECKED_ON). tests/unit/floor/test_compat.py fails when one of them
moves: the name, its signature, and the behaviour looper relies on where that is
cheap to check. After upgrading TensorFlow or Keras, run it first, then update
CHECKED_ON and the docstrings.

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
  through `transform` before it applies them.

  Touches: `_all_reduce_sum_gradients(grads_and_vars)` of Keras' TensorFlow
  optimizer (keras/src/backend/tensorflow/optimizer.py), which
  `apply_gradients` calls in replica context and whose (gradient, variable)
  pairs it then applies; it is replaced on this instance. A
  LossScaleOptimizer has its inner optimizer sum (in the replica threads of
  `call_for_each_replica`, the gradients unscaled and known finite), so
  the hook goes on the inner one.

  Why: `optimizer.clip_global_norm` clips the global batch's gradient after
  the sum (Keras' clipnorm: each replica's before it), the health figures
  log its norm, with no all-reduce of their own; no public hook is there.

  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  target = getattr(optimizer, "inner_optimizer", optimizer)
  all_reduce = target._all_reduce_sum_gradients  # pylint: disable=protected-access
  target._all_reduce_sum_gradients = (  # pylint: disable=protected-access
      lambda grads_and_vars: transform(all_reduce(grads_and_vars)))


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` trains across several worker processes.

  Touches: `strategy.extended._in_multi_worker_mode()`. True only for a
  MultiWorkerMirroredStrategy with more than one worker; False for the
  default, OneDevice, Mirrored and (whatever its hosts) TPU strategies.

  Why: the train stream is declared endless only where tf.distribute asks
  every worker at each get_next whether it still has data (the Trainer's
  `_endless`). The public route, counting the tasks in the spec of
  `strategy.cluster_resolver`, would restate for each strategy which jobs
  train and that a TPU pod counts as one worker.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return strategy.extended._in_multi_worker_mode()  # pylint: disable=protected-access


def configure_coordination_service(*, leader: str, jobs: dict[str, int],
                                   register_timeout_ms: int,
                                   heartbeat_timeout_ms: int) -> None:
  """Sets the multi-worker coordination service's limits, before the
  strategy is built: `jobs` ({job: number of tasks}) register with `leader`
  behind a barrier within `register_timeout_ms`, and a task whose
  heartbeats stop for `heartbeat_timeout_ms` fails the others.

  Touches: the eager context (tensorflow.python.eager.context.context()),
  its `configure_coordination_service(service_type, service_leader,
  cluster_register_timeout_in_ms, heartbeat_timeout_in_ms,
  coordinated_jobs)` with CoordinatedJob protos
  (tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2), and the
  `cluster_register_with_barrier` field of the config it stores (the
  context's `coordination_service`), which its ConfigProto carries to the
  server. MultiWorkerMirroredStrategy keeps a configuration set before it.

  Why: by default a missing worker is waited for an hour or more, and a
  peer whose host went silent until heartbeats time out; no public API or
  environment variable sets either. Without the barrier the leader waits
  regardless of the timeout.
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

  Why: `train.deterministic=False` undoes what an earlier deterministic run
  in the same process (a notebook, a test) turned on; op determinism
  refuses `tf.timestamp`, which times the input.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.framework import config  # pylint: disable=g-import-not-at-top
  config.disable_op_determinism()


def patch_keras_async_copy() -> None:
  """Lets TensorFlow's async checkpointing copy Keras 3 variables more than
  once (idempotent; the checkpoint format is unchanged).

  Touches: `_copy_trackable_to_cpu(self, object_map)` of Keras' TensorFlow
  Variable (keras/src/backend/tensorflow/core.py), replaced on the class
  by one that delegates to the wrapped tf.Variable's method of that name.

  Why: Keras' version creates a new CPU tf.Variable inside a tf.function
  on every save, so the second async save fails with "tf.function only
  supports singleton tf.Variables created on the first call"; the wrapped
  tf.Variable updates its CPU copy in place.
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

  Touches: the Checkpoint's `_async_checkpointer_impl` (None until its
  first async save) and that helper's `_check_async_thread_error()`.

  Why: `sync()` does not raise a failed background write; it would surface
  only at the next save, or be lost at exit.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  helper = checkpoint._async_checkpointer_impl  # pylint: disable=protected-access
  if helper is not None:
    helper._check_async_thread_error()  # pylint: disable=protected-access


def mark_expected_partial(value) -> bool:
  """Marks `value` expected-partial if it is TensorFlow's record of a
  checkpoint restore; returns whether it was one.

  Touches: tensorflow.python.checkpoint.checkpoint.
  _CheckpointRestoreCoordinator and its `expect_partial` property (what
  the public `status.expect_partial()` sets).

  Why: a restore that fails (a workdir holding another model) raises
  before it returns the status, and the record lives on in the frames of
  the error's traceback: deleted at exit, after looper's one error line,
  it logs "deleted with unrestored values" warnings unless marked.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.checkpoint import checkpoint  # pylint: disable=g-import-not-at-top
  if not isinstance(value, checkpoint._CheckpointRestoreCoordinator):  # pylint: disable=protected-access
    return False
  value.expect_partial = True
  return True


def dataset_graph(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
  """The GraphDef of `dataset`'s whole pipeline, its functions included.

  Touches: `tf.data.Dataset._as_serialized_graph()`.

  Why: `looper check` names the ops that call back into Python
  (`py_function`, `numpy_function`, `from_generator`), which a TPU host
  cannot run; tf.data has no public view of a pipeline's graph.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return tf.compat.v1.GraphDef.FromString(
      dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access


def function_graphs(graph) -> list:
  """The graphs of the functions defined in `graph` (a FuncGraph): the
  bodies and conditions of its while loops and branches of its conds.

  Touches: `FuncGraph._functions` ({name: AtomicFunction}) and each
  function's `graph`.

  Why: `looper check` finds ops with data-dependent output shapes inside
  loops too (a train loop's body); a FuncGraph lists them nowhere public.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  bodies = (getattr(f, "graph", None) for f in graph._functions.values())  # pylint: disable=protected-access
  return [body for body in bodies if body is not None]


def function_graph(graph, name: str):
  """The traced graph (FuncGraph) of the function `name` an op of `graph`
  calls (a while loop's body, a cond's branch, a tf.function), or None.

  Touches: `Graph._get_function(name)` (an AtomicFunction) and its `graph`.

  Why: looper.train.flops counts a step's FLOPs inside the loop's body and
  the functions it calls, with their shapes; the library of
  `graph.as_graph_def()` has no shapes, and no public API maps a call to
  its graph.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return getattr(graph._get_function(name), "graph", None)  # pylint: disable=protected-access


def on_gce() -> bool:
  """Whether this process runs on a Google Compute Engine VM (a Cloud TPU
  VM is one), decided as TensorFlow's preemption handler decides it.

  Touches: `on_gcp()` of tensorflow/python/distribute/failure_handling/
  failure_handling_util.py (PreemptionCheckpointHandler's
  `detect_platform` asks it): one GET of
  `http://$GCE_METADATA_IP/computeMetadata/v1/instance/hostname` (host
  metadata.google.internal when unset) with `Metadata-Flavor: Google`,
  through `requests` with a 5 s timeout; True on status 200, False on
  another status or any requests error (a refused connection at once).

  Why: looper watches the metadata server's preemption and maintenance
  notices (looper.train.vm_notices) exactly where TensorFlow would; no public
  API says whether this is a GCE VM.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.distribute.failure_handling import failure_handling_util  # pylint: disable=g-import-not-at-top
  return failure_handling_util.on_gcp()


def ask_dispatcher(address: str, method: str, timeout_secs: float) -> bytes:
  """Calls `method` of the tf.data service dispatcher at `address`
  (HOST:PORT) with an empty request, waiting up to `timeout_secs` for it
  to come up; returns the serialized response.

  Touches: the dispatcher's gRPC service and methods
  (tensorflow/core/data/service/dispatcher.proto: service
  `tensorflow.data.DispatcherService`, rpc `GetVersion` and `GetWorkers`),
  called through grpcio (a TensorFlow dependency) without TF's protos: an
  empty GetWorkersResponse (b'') means no worker. Raises grpc.RpcError:
  DEADLINE_EXCEEDED when nothing answered, UNIMPLEMENTED when another
  gRPC server answered (a service worker's port).

  Why: `tf.data.experimental.service.distribute` waits an hour for a
  dispatcher that does not answer, and forever for a worker, with no
  timeout to set; looper's start-up check says what is missing at once.
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
  `get_config_key_value(key)` (tensorflow.python.eager.context), which
  reach the coordination service every MultiWorkerMirroredStrategy
  process is connected to (TensorFlow's preemption handler uses them).

  Why: every worker of a run must read one tf.data service job, under one
  name that no earlier attempt used: the chief draws it, the others read
  it; no public API shares a string between the workers.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  if value is not None:
    context.context().set_config_key_value(key, value)
    return value
  return context.context().get_config_key_value(key)


def sublayers(model) -> list:
  """`model` and every layer inside it (a MultiHeadAttention's dropout, an
  RNN's cell), each once, in the order Keras tracks them.

  Touches: Keras' `Layer._flatten_layers(include_self, recursive)`.

  Why: `model.layers` lists only the top level; the random layers looper
  adopts sit anywhere (looper.train.randomness).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return list(model._flatten_layers(include_self=True, recursive=True))  # pylint: disable=protected-access


def seed_generators(layer) -> list:
  """The SeedGenerators `layer` itself holds (not its sublayers').

  Touches: Keras' `Layer._seed_generators`, which its attribute tracker
  fills with each SeedGenerator assigned to the layer.

  Why: a SeedGenerator's state is a variable `tf.train.Checkpoint(model=)`
  does not reach; looper checkpoints it (looper.train.randomness).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return list(getattr(layer, "_seed_generators", []))


@contextlib.contextmanager
def keras_variables_deferred():
  """Keras variables made inside (a metric object's) create no TensorFlow
  variable, now or later.

  Touches: `keras.StatelessScope(initialize_variables=False)`, under
  which a Keras variable is registered as uninitialized, not created, and
  Keras' global list of those (`global_state` "uninitialized_variables"),
  which the next StatelessScope to close would initialize: dropped.

  Why: a config file's metric object would create its variables while the
  config loads, starting TensorFlow before looper sets the devices up
  (logical CPU devices, multi-worker collectives). Looper rebuilds the
  metric from its class and config in the strategy's scope.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
  key = "uninitialized_variables"
  before = list(global_state.get_global_attribute(key, []) or [])
  try:
    with keras.StatelessScope(initialize_variables=False):
      yield
  finally:
    global_state.set_global_attribute(key, before)


def output_operation(model):
  """The Keras operation (a layer, or an op such as `keras.ops.softmax`)
  that makes a functional or Sequential model's one output; None for a
  subclassed model or several outputs.

  Touches: `KerasTensor._keras_history`, the (operation, node index,
  tensor index) Keras records on each symbolic tensor of a model.

  Why: `model.layers` leaves out ops, so a model ending in
  `keras.ops.softmax(x)` would look linear to the dry run's logits check.
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  outputs = getattr(model, "outputs", None)
  if not outputs or len(outputs) != 1:
    return None
  history = getattr(outputs[0], "_keras_history", None)
  return history.operation if history is not None else None


def metric_direction(metric) -> str | None:
  """'up' or 'down': which way a Keras metric gets better; None if unsaid.

  Touches: the `_direction` Keras' metrics set in their constructors,
  which a MonitorCallback's mode 'auto' reads through a compiled model.

  Why: EarlyStopping(monitor="val_accuracy") on looper's model, which is
  not compiled (looper.train.callback_state.resolve_modes).
  Checked on TensorFlow 2.21.0 / Keras 3.15.1.
  """
  return getattr(metric, "_direction", None)
