"""looper.compat: each private TensorFlow/Keras API looper uses is still
there, with the signature and the behaviour looper relies on.

A failure here after an upgrade names the entry to re-check (its docstring
says what it touches and why); fix it in looper/compat.py alone.
"""

import inspect
import pathlib
import time
import types
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import compat
from looper import keras_compat
from tests.fixtures.servers import loopback_server


def _parameters(fn) -> list[str]:
  return list(inspect.signature(fn).parameters)


def test_every_entry_names_its_versions_and_is_tested_here():
  line = (f"Checked on TensorFlow {compat.CHECKED_ON['tensorflow']} /"
          f" Keras {compat.CHECKED_ON['keras']}.")
  entries = [f for f in vars(compat).values()
             if inspect.isfunction(f) and f.__module__ == compat.__name__]
  source = pathlib.Path(__file__).read_text()
  assert entries
  for entry in entries:
    assert line in inspect.getdoc(entry), entry.__name__
    assert f"compat.{entry.__name__}(" in source, entry.__name__


# --- after_all_reduce: Keras' optimizer sums in _all_reduce_sum_gradients ---


def test_keras_sums_gradients_in_all_reduce_sum_gradients():
  from keras.src.backend.tensorflow import optimizer  # pylint: disable=g-import-not-at-top
  method = optimizer.TFOptimizer._all_reduce_sum_gradients  # pylint: disable=protected-access
  assert _parameters(method) == ["self", "grads_and_vars"]
  assert isinstance(keras.optimizers.SGD(1.0), optimizer.TFOptimizer)


@pytest.mark.parametrize("scaled", [False, True])
def test_apply_gradients_passes_the_sum_through_the_hook(scaled):
  # One replica, and no collective ops: a collective's group key would
  # clash with a Mirrored strategy of another size later in this process.
  strategy = tf.distribute.MirroredStrategy(
      ["/cpu:0"], cross_device_ops=tf.distribute.ReductionToOneDevice())
  with strategy.scope():
    w = keras.Variable([0.0])
    sgd = keras.optimizers.SGD(1.0)
    opt = keras.optimizers.LossScaleOptimizer(sgd) if scaled else sgd
    opt.build([w])
  calls = []

  def triple(grads_and_vars):
    calls.append(tf.distribute.in_cross_replica_context())
    return [(g * 3.0, v) for g, v in grads_and_vars]
  compat.after_all_reduce(opt, triple)
  scale = float(opt.dynamic_scale.numpy()) if scaled else 1.0

  @tf.function
  def step():
    strategy.run(lambda: opt.apply_gradients([(tf.constant([scale]), w)]))
  step()
  assert calls == [False]  # traced once, in the replica context
  np.testing.assert_array_equal(w.numpy(), [-3.0])  # unscaled, tripled


# --- all_gather: sharding's one collective per step ----------------------


def test_all_gather_is_one_collective_and_the_replicas_end_to_end():
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from tests.fixtures.configs import SESSION_CPUS  # pylint: disable=g-import-not-at-top
  strategy = distribute.mirrored(distribute.split_cpu(SESSION_CPUS))

  @tf.function
  def step():  # replica r gives [r, r + 0.5]
    def gather():
      r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                  tf.float32)
      return compat.all_gather(tf.stack([r, r + 0.5]))
    return strategy.run(gather)
  got = [t.numpy().tolist()
         for t in strategy.experimental_local_results(step())]
  assert got == [[0.0, 0.5, 1.0, 1.5]] * 2
  ops = [op.type for op in step.get_concrete_function().graph.get_operations()]
  assert [o for o in ops if "Collective" in o] == ["CollectiveGatherV2"] * 2


# --- uses_weight_decay, saved_as_variable, optimizer_layout: sharded saves --


def test_uses_weight_decay_answers_both_ways_of_excluding():
  kernel, other, bias = (keras.Variable([1.0], name=n)
                         for n in ("kernel", "other", "bias"))
  opt = keras.optimizers.AdamW(weight_decay=0.1)
  opt.exclude_from_weight_decay(var_list=[kernel], var_names=["bias"])
  opt.build([kernel, other, bias])
  assert [compat.uses_weight_decay(opt, v) for v in (kernel, other, bias)
          ] == [False, True, False]


def test_optimizer_layout_saves_a_stand_in_under_the_optimizers_keys(
    tmp_path):
  w = keras.Variable([1.0, 2.0, 3.0])
  opt = keras.optimizers.Adam(0.1)
  opt.build([w])
  opt.apply_gradients([(tf.constant([1.0, 1.0, 1.0]), w)])
  slot = opt.variables[2]  # after the step and rate: the first moment
  assert "momentum" in slot.name
  restored = []
  layout = compat.optimizer_layout(opt, [w], {
      id(slot): compat.saved_as_variable(lambda: slot * 10.0,
                                         restored.append)})
  direct = tf.train.Checkpoint(optimizer=opt).write(str(tmp_path / "direct"))
  compat.patch_keras_async_copy()  # as the Checkpointer does
  options = tf.train.CheckpointOptions(
      experimental_enable_async_checkpoint=True)  # the host copy, twice
  saving = tf.train.Checkpoint(optimizer=layout)
  saving.write(str(tmp_path / "first"), options=options)
  saving.sync()
  slot.assign(slot * 2.0)
  path = saving.write(str(tmp_path / "laid_out"), options=options)
  saving.sync()
  want, got = tf.train.load_checkpoint(direct), tf.train.load_checkpoint(path)
  shapes = {k: v for k, v in want.get_variable_to_shape_map().items()
            if k.startswith("optimizer/")}
  assert len(shapes) == 5  # the step, rate, weight and Adam's two slots
  assert shapes == {k: v for k, v in got.get_variable_to_shape_map().items()
                    if k.startswith("optimizer/")}
  for key in shapes:
    if "_variables/2/" in key:  # the slot, by its stand-in
      np.testing.assert_allclose(got.get_tensor(key),
                                 want.get_tensor(key) * 20.0)
    else:
      np.testing.assert_array_equal(got.get_tensor(key), want.get_tensor(key))
  tf.train.Checkpoint(optimizer=compat.optimizer_layout(
      opt, [w], {id(slot): compat.saved_as_variable(
          lambda: slot, restored.append)})).read(
          direct).assert_existing_objects_matched()
  np.testing.assert_array_equal(restored[0], want.get_tensor(
      [k for k in shapes if "_variables/2/" in k][0]))


# --- in_multi_worker_mode ---------------------------------------------------


def _extended_classes():
  from tensorflow.python.distribute import collective_all_reduce_strategy as collective  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import distribute_lib  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import mirrored_strategy  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import one_device_strategy  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import tpu_strategy  # pylint: disable=g-import-not-at-top
  return [distribute_lib._DefaultDistributionExtended,  # pylint: disable=protected-access
          one_device_strategy.OneDeviceExtended,
          mirrored_strategy.MirroredExtended,
          collective.CollectiveAllReduceExtended, tpu_strategy.TPUExtended]


def test_every_strategy_looper_builds_answers_in_multi_worker_mode():
  from tensorflow.python.distribute import distribute_lib  # pylint: disable=g-import-not-at-top
  base = distribute_lib.StrategyExtendedV2._in_multi_worker_mode  # pylint: disable=protected-access
  for cls in _extended_classes():
    method = cls._in_multi_worker_mode  # pylint: disable=protected-access
    assert _parameters(method) == ["self"], cls
    assert method is not base, cls  # the base raises NotImplementedError


def test_only_several_workers_are_multi_worker_mode():
  for strategy in (tf.distribute.get_strategy(),
                   tf.distribute.OneDeviceStrategy("/cpu:0"),
                   tf.distribute.MirroredStrategy(["/cpu:0"])):
    assert compat.in_multi_worker_mode(strategy) is False, strategy
  collective = _extended_classes()[3]
  for workers in (1, 2):  # without starting a cluster
    extended = object.__new__(collective)
    extended._num_workers = workers  # pylint: disable=protected-access
    assert compat.in_multi_worker_mode(
        types.SimpleNamespace(extended=extended)) is (workers == 2)


# --- configure_coordination_service ----------------------------------------


def test_the_coordination_limits_reach_the_servers_config():
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  wanted = {"service_type", "service_leader", "cluster_register_timeout_in_ms",
            "heartbeat_timeout_in_ms", "coordinated_jobs"}
  assert wanted <= set(_parameters(
      context.Context.configure_coordination_service))
  fresh = context.Context()  # not the process's own context
  with mock.patch.object(context, "context", lambda: fresh):
    compat.configure_coordination_service(
        leader="/job:chief/replica:0/task:0", jobs={"chief": 1, "worker": 2},
        register_timeout_ms=5000, heartbeat_timeout_ms=2500)
  got = fresh.config.experimental.coordination_config  # what the server gets
  assert (got.service_type, got.service_leader) == (
      "standalone", "/job:chief/replica:0/task:0")
  assert (got.cluster_register_timeout_in_ms, got.heartbeat_timeout_in_ms,
          got.cluster_register_with_barrier) == (5000, 2500, True)
  assert [(j.name, j.num_tasks) for j in got.coordinated_job_list] == [
      ("chief", 1), ("worker", 2)]


# --- disable_op_determinism -------------------------------------------------


def test_op_determinism_turns_off_again():
  tf.config.experimental.enable_op_determinism()
  try:
    with pytest.raises(tf.errors.FailedPreconditionError):
      tf.timestamp()  # refused under op determinism
  finally:
    compat.disable_op_determinism()
  assert float(tf.timestamp()) > 0


# --- patch_keras_async_copy, raise_async_save_error -------------------------

_ASYNC = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)


def test_keras_and_tf_variables_copy_to_cpu_by_object_map():
  from keras.src.backend.tensorflow import core  # pylint: disable=g-import-not-at-top
  for cls in (core.Variable, type(tf.Variable(0.0))):
    assert _parameters(cls._copy_trackable_to_cpu) == ["self", "object_map"]  # pylint: disable=protected-access


def test_async_saves_of_a_keras_variable_after_the_patch(tmp_path):
  compat.patch_keras_async_copy()
  compat.patch_keras_async_copy()  # idempotent
  v = keras.Variable([1.0, 2.0])
  ckpt = tf.train.Checkpoint(v=v)
  paths = []
  for value in ([3.0, 4.0], [5.0, 6.0]):  # unpatched, the 2nd save fails
    v.assign(value)
    paths.append(ckpt.save(str(tmp_path / "ckpt"), options=_ASYNC))
    ckpt.sync()
  for path, value in zip(paths, ([3.0, 4.0], [5.0, 6.0])):
    np.testing.assert_array_equal(
        tf.train.load_checkpoint(path).get_tensor(
            "v/.ATTRIBUTES/VARIABLE_VALUE"), value)


def test_a_failed_background_write_is_raised_after_sync(tmp_path):
  ckpt = tf.train.Checkpoint(v=tf.Variable([1.0]))
  compat.raise_async_save_error(ckpt)  # no async save yet: nothing
  ckpt.save(str(tmp_path / "ok" / "ckpt"), options=_ASYNC)
  ckpt.sync()
  compat.raise_async_save_error(ckpt)  # a good write: nothing
  (tmp_path / "file").write_text("not a directory")
  ckpt.save(str(tmp_path / "file" / "ckpt"), options=_ASYNC)
  ckpt.sync()  # does not raise it (why looper asks)
  with pytest.raises(tf.errors.FailedPreconditionError,
                     match="not a directory"):
    compat.raise_async_save_error(ckpt)


# --- mark_expected_partial --------------------------------------------------


def test_a_failed_restore_leaves_its_record_in_the_traceback(tmp_path):
  from tensorflow.python.checkpoint import checkpoint  # pylint: disable=g-import-not-at-top
  prop = checkpoint._CheckpointRestoreCoordinator.expect_partial  # pylint: disable=protected-access
  assert isinstance(prop, property) and prop.fset is not None
  path = tf.train.Checkpoint(v=tf.Variable(tf.zeros([2]))).save(
      str(tmp_path / "c"))
  with pytest.raises(ValueError) as info:  # another model: another shape
    tf.train.Checkpoint(v=tf.Variable(tf.zeros([3]))).restore(path)
  records, tb = [], info.value.__traceback__
  while tb is not None:
    records += [v for v in tb.tb_frame.f_locals.values()
                if compat.mark_expected_partial(v)]
    tb = tb.tb_next
  assert records and all(r.expect_partial for r in records)
  assert compat.mark_expected_partial(path) is False


# --- dataset_graph, function_graphs -----------------------------------------


def test_a_datasets_graph_holds_its_functions_ops():
  dataset = tf.data.Dataset.range(3).map(
      lambda x: tf.py_function(lambda y: y + 1, [x], tf.int64))
  graph = compat.dataset_graph(dataset)
  assert {"RangeDataset", "MapDataset"} <= {n.op for n in graph.node}
  assert "EagerPyFunc" in {n.op for f in graph.library.function
                           for n in f.node_def}


def test_a_loops_body_is_a_function_graph():
  @tf.function
  def unique_in_a_loop(x):
    body = lambda i, x: (i + 1, x + tf.reduce_sum(tf.unique(x)[0]))
    return tf.while_loop(lambda i, x: i < 2, body, [tf.constant(0), x])
  graph = unique_in_a_loop.get_concrete_function(
      tf.TensorSpec([1], tf.float32)).graph
  assert "Unique" not in {op.type for op in graph.get_operations()}
  bodies = compat.function_graphs(graph)
  assert len(bodies) == 2  # the loop's condition and body
  assert "Unique" in {op.type for body in bodies
                      for op in body.get_operations()}


# --- on_gce: TensorFlow's GCE test asks instance/hostname --------------------


def test_on_gce_is_instance_hostname_answering_at_gce_metadata_ip(
    tmp_path, monkeypatch):
  hostname = tmp_path / "computeMetadata" / "v1" / "instance" / "hostname"
  hostname.parent.mkdir(parents=True)
  hostname.write_text("fake.c.looper.internal")
  with loopback_server(tmp_path) as url:
    monkeypatch.setenv("GCE_METADATA_IP", url.removeprefix("http://"))
    assert compat.on_gce()
    hostname.unlink()  # a 404
    assert not compat.on_gce()
  # What the test environment sets: nothing listens there. One attempt,
  # refused at once (not a wait for requests' 5 s timeout, nor a retry).
  monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
  import urllib3  # pylint: disable=g-import-not-at-top  (requests' transport)
  connect, failed = urllib3.util.connection.create_connection, []

  def counted(*args, **kwargs):
    try:
      return connect(*args, **kwargs)
    except OSError as e:
      failed.append(type(e))
      raise
  monkeypatch.setattr(urllib3.util.connection, "create_connection", counted)
  assert not compat.on_gce()
  assert failed == [ConnectionRefusedError]


# --- ask_dispatcher: the tf.data service dispatcher's gRPC methods -----------


def test_a_dispatcher_answers_get_version_and_lists_its_workers():
  import grpc  # pylint: disable=g-import-not-at-top
  service = tf.data.experimental.service
  dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
  address = dispatcher.target.removeprefix("grpc://")
  try:
    assert compat.ask_dispatcher(address, "GetVersion", 5)
    assert compat.ask_dispatcher(address, "GetWorkers", 5) == b""  # none
    worker = service.WorkerServer(service.WorkerConfig(
        dispatcher_address=address, heartbeat_interval_ms=100))
    try:
      deadline = time.monotonic() + 5
      while not compat.ask_dispatcher(address, "GetWorkers", 5):
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.05)
      with pytest.raises(grpc.RpcError) as e:  # a worker's port
        compat.ask_dispatcher(worker._address, "GetVersion", 5)  # pylint: disable=protected-access
      assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
      worker.stop()
  finally:
    dispatcher.stop()


# --- shared_value: the coordination service's key-value store ---------------


def test_the_eager_context_reaches_the_key_value_store():
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  assert _parameters(context.Context.set_config_key_value) == [
      "self", "key", "value"]
  assert _parameters(context.Context.get_config_key_value)[:2] == [
      "self", "key"]
  store = {}
  fake = types.SimpleNamespace(set_config_key_value=store.__setitem__,
                               get_config_key_value=store.__getitem__)
  with mock.patch.object(context, "context", return_value=fake):
    assert compat.shared_value("looper/k", "v") == "v"  # the chief sets
    assert compat.shared_value("looper/k", None) == "v"  # the others read


def test_a_call_names_its_function_graph():
  inner = tf.function(lambda x: tf.matmul(x, x))

  @tf.function
  def outer(x):
    return tf.while_loop(lambda i, x: i < 2, lambda i, x: (i + 1, inner(x)),
                         [0, x])

  graph = outer.get_concrete_function(tf.TensorSpec([2, 2])).graph
  (loop,) = [op for op in graph.get_operations()
             if op.type in ("While", "StatelessWhile")]
  body = compat.function_graph(graph, loop.get_attr("body").name)
  (call,) = [op for op in body.get_operations()
             if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
  called = compat.function_graph(body, call.get_attr("f").name)
  assert "MatMul" in {op.type for op in called.get_operations()}
  assert compat.function_graph(graph, "no_such_function") is None


# --- sublayers, seed_generators: Keras' layer tracking (randomness) --------


def test_nested_layers_and_their_seed_generators_are_tracked():
  attention = keras.layers.MultiHeadAttention(2, 4, dropout=0.1)
  model = keras.Sequential([keras.Input((3, 4)), keras.layers.Dropout(0.2),
                            keras.layers.LSTM(4, dropout=0.1,
                                              return_sequences=True)])
  x = tf.zeros([1, 3, 4])
  attention(x, x)
  names = [type(l).__name__ for l in keras_compat.sublayers(model)]
  assert names == ["Sequential", "InputLayer", "Dropout", "LSTM", "LSTMCell"]
  inner = keras_compat.sublayers(attention)
  assert [type(l).__name__ for l in inner].count("Dropout") == 1
  counts = {type(l).__name__: len(keras_compat.seed_generators(l))
            for l in keras_compat.sublayers(model) + inner}
  assert counts == {"Sequential": 0, "InputLayer": 0, "Dropout": 1,
                    "LSTM": 0, "LSTMCell": 1, "MultiHeadAttention": 0,
                    "EinsumDense": 0, "Softmax": 0}
  state = keras_compat.seed_generators(model.layers[0])[0].state
  assert isinstance(state, keras.Variable) and state.shape == (2,)


# --- keras_variables_deferred: a config file's metric objects ------------


def test_keras_variables_made_deferred_create_no_tensorflow_variable():
  with keras_compat.keras_variables_deferred():
    metric = keras.metrics.SparseTopKCategoricalAccuracy(k=3)
  assert all(v._value is None for v in metric.variables)  # pylint: disable=protected-access
  # Not initialized by the next stateless scope to close either (Keras'
  # symbolic build of a functional model runs one).
  keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  assert all(v._value is None for v in metric.variables)  # pylint: disable=protected-access
  # What looper builds from it is real.
  copy = type(metric).from_config(metric.get_config())
  copy.update_state([1], [[0.1, 0.5, 0.2, 0.0]])
  assert float(copy.result()) == 1.0


def test_a_functional_models_output_names_its_operation():
  inputs = keras.Input((3,))
  hidden = keras.layers.Dense(4, name="logits")(inputs)
  assert keras_compat.output_operation(
      keras.Model(inputs, hidden)).name == "logits"
  op = keras_compat.output_operation(
      keras.Model(inputs, keras.ops.softmax(hidden)))
  assert type(op).__name__ == "Softmax"
  assert keras_compat.output_operation(keras.Sequential(
      [keras.Input((3,)), keras.layers.Dense(2, name="last")])).name == "last"


def test_keras_metrics_say_which_way_they_get_better():
  assert keras_compat.metric_direction(
      keras.metrics.SparseCategoricalAccuracy()) == "up"
  assert keras_compat.metric_direction(keras.metrics.AUC()) == "up"
  assert keras_compat.metric_direction(
      keras.metrics.MeanSquaredError()) == "down"
  assert keras_compat.metric_direction(keras.metrics.Mean()) is None
