"""Strategy choice, the TPU path (real resolver, mocked TPU system), chief."""

import json
import types
from unittest import mock

import pytest
import tensorflow as tf

from looper import config as lc
from looper.train import distribute


def dist(**fields):
  c = lc.default_config().distribution
  c.update(fields)
  return c


TWO_WORKERS = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                          "task": {"type": "worker", "index": 0}})


@pytest.mark.parametrize("fields,gpus,tf_config,want", [
    ({}, 0, "", "default"),
    ({}, 1, "", "default"),
    ({}, 2, "", "mirrored"),
    ({"num_cpu_devices": 4}, 0, "", "mirrored"),
    ({}, 0, TWO_WORKERS, "multi_worker"),
    ({"tpu": "local"}, 0, TWO_WORKERS, "tpu"),
    ({"strategy": "one_device"}, 2, TWO_WORKERS, "one_device"),
    ({"strategy": "mirrored"}, 0, "", "mirrored"),
])
def test_auto_choice(monkeypatch, fields, gpus, tf_config, want):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  assert distribute.choose(dist(**fields), num_gpus=gpus) == want


def test_bad_tf_config_is_one_line(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", "{not json")
  with pytest.raises(lc.ConfigError, match=r"^TF_CONFIG='\{not json' is not"):
    distribute.choose(dist(), num_gpus=0)


def test_multi_worker_needs_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  c = lc.default_config()
  c.distribution.strategy = "multi_worker"
  with pytest.raises(lc.ConfigError, match="needs TF_CONFIG"):
    distribute.strategy_for(c)


def test_tpu_path_resolves_connects_initializes(monkeypatch):
  """The real TPUClusterResolver on a loopback address; TPU calls mocked."""
  c = lc.default_config()
  c.distribution.strategy = "tpu"
  c.distribution.tpu = "grpc://127.0.0.1:8470"
  with mock.patch.object(tf.config, "experimental_connect_to_cluster") as con, \
       mock.patch.object(tf.tpu.experimental, "initialize_tpu_system") as init, \
       mock.patch.object(tf.distribute, "TPUStrategy") as strategy:
    assert distribute.strategy_for(c) is strategy.return_value
  resolver = con.call_args.args[0]
  assert isinstance(resolver, tf.distribute.cluster_resolver.TPUClusterResolver)
  assert resolver.master() == "grpc://127.0.0.1:8470"
  init.assert_called_once_with(resolver)
  strategy.assert_called_once_with(resolver)


def test_cpu_devices_cannot_change_after_start():
  tf.constant(1)  # TensorFlow has started with one CPU device
  with pytest.raises(lc.ConfigError, match="already started with 1 CPU"):
    distribute.split_cpu(3)


def _strategy(cluster, task_type, task_id):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id)
  return types.SimpleNamespace(cluster_resolver=resolver)


@pytest.mark.parametrize("cluster,task_type,task_id", [
    ({"worker": ["a:1", "b:1"]}, "worker", 1),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0),
])
def test_task_id(cluster, task_type, task_id):
  assert distribute.task_id(_strategy(cluster, task_type, task_id)) == task_id
  assert distribute.task_id(tf.distribute.get_strategy()) == 0


@pytest.mark.parametrize("tf_config,size,leader", [
    ("", 0, None),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker",'
     ' "index": 1}}', 2, "/job:worker/replica:0/task:0"),
    ('{"cluster": {"chief": ["c:1"], "worker": ["a:1"], "evaluator":'
     ' ["e:1"]}, "task": {"type": "worker", "index": 0}}', 2,
     "/job:chief/replica:0/task:0"),
])
def test_the_cluster_is_tf_configs_training_jobs(monkeypatch, tf_config,
                                                 size, leader):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  assert distribute._cluster_size() == size  # pylint: disable=protected-access
  assert distribute.coordination_leader() == leader


@pytest.mark.parametrize("batch,cores,warning", [
    (1024, 8, None),
    (64, 8, None),
    (32, 8, "config.train.batch_size=32 gives 4 examples per TPU core (8"
     " cores); a core pads to a multiple of 8, so set"
     " --config.train.batch_size=64 (the TPU guides use 128 per core: 1024)"),
    (96, 8, "config.train.batch_size=96 gives 12 examples per TPU core (8"
     " cores); a core pads to a multiple of 8, so set"
     " --config.train.batch_size=128 (the TPU guides use 128 per core: 1024)"),
    (100, 8, "config.train.batch_size=100 gives 12.5 examples per TPU core"
     " (8 cores); a core pads to a multiple of 8, so set"
     " --config.train.batch_size=128 (the TPU guides use 128 per core: 1024)"),
])
def test_tpu_batch_per_core(batch, cores, warning):
  assert distribute.tpu_batch_warning(batch, cores) == warning


def test_tpu_cores_come_from_the_strategy_or_the_dry_run_field():
  assert distribute.tpu_cores(tf.distribute.get_strategy(), dist()) == 0
  assert distribute.tpu_cores(tf.distribute.get_strategy(),
                              dist(tpu_cores=32)) == 32
  tpu = mock.create_autospec(tf.distribute.TPUStrategy, instance=True)
  tpu.num_replicas_in_sync = 8
  assert distribute.tpu_cores(tpu, dist(tpu_cores=32)) == 8


def test_a_dry_run_warns_about_the_batch_per_core(tmp_path, caplog):
  from looper import run  # pylint: disable=g-import-not-at-top
  from tests import tiny  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  c.train.steps, c.distribution.tpu_cores = 1, 8
  with caplog.at_level("WARNING"):
    run.run(c, str(tmp_path), "train")
  assert any(r.getMessage().startswith(
      "config.train.batch_size=32 gives 4 examples per TPU core (8 cores)")
             for r in caplog.records)


@pytest.mark.parametrize("cluster,leader", [
    ({"worker": ["a:1", "b:1"]}, "/job:worker/replica:0/task:0"),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "/job:chief/replica:0/task:0"),
    (None, None),
])
def test_the_coordination_leader_is_the_chief(monkeypatch, cluster, leader):
  if cluster is None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
  else:
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": 0}}))
  assert distribute.coordination_leader() == leader


def test_a_worker_that_lost_the_chief_names_it():
  """The text a worker got when the chief's host was cut (tests/test_hosts.py
  records it live): its heartbeats to the chief's service timed out."""
  from looper import errors  # pylint: disable=g-import-not-at-top
  e = tf.errors.DeadlineExceededError(None, None, (
      "Graph execution error:\n\nDetected at node while/CollectiveReduceV2"
      "\n\nCollective ops is aborted by: Deadline Exceeded\n\nRPC:"
      " /tensorflow.CoordinationService/Heartbeat\nThe error could be from a"
      " previous operation. Restart your program to reset.\n\t [[{{node"
      " while/CollectiveReduceV2}}]] [Op:__inference__train_loop_961]"))
  assert errors.cluster_error(
      e, 8, leader="/job:worker/replica:0/task:0") == (
          "lost the chief /job:worker/replica:0/task:0 (no answer to"
          " heartbeats within distribution.worker_timeout_secs=8: its host is"
          " unreachable or gone); this worker stopped too. Restart all workers"
          " with the same command to resume from the last checkpoint")
  assert errors.cluster_error(e, 8, leader=None) is None  # not multi-worker


FAKE_GPUS = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
             for i in range(2)]


def test_every_gpu_grows_its_memory_before_the_strategy():
  c = lc.default_config()
  c.distribution.strategy = "default"
  with mock.patch.object(tf.config, "list_physical_devices",
                         lambda kind: FAKE_GPUS if kind == "GPU" else []), \
       mock.patch.object(tf.config.experimental, "set_memory_growth") as grow:
    distribute.strategy_for(c)
  assert grow.call_args_list == [mock.call(gpu, True) for gpu in FAKE_GPUS]


@pytest.mark.parametrize("refusal,tries,warnings", [
    # An op ran before the run: one line (not one per GPU); the run goes on.
    (RuntimeError("Physical devices cannot be modified after being"
                  " initialized"), 1,
     ["GPU memory growth not set: TensorFlow started on the GPUs before the"
      " run, so this process keeps the memory it took and another looper"
      " process on them may find none; run no TensorFlow op before looper's"
      " run in this process"]),
    # The user split the GPUs into logical devices: their own memory limits.
    (ValueError("Cannot set memory growth on device when virtual devices"
                " configured"), 2, []),
])
def test_a_refused_memory_growth_does_not_stop_the_run(caplog, refusal, tries,
                                                        warnings):
  with mock.patch.object(tf.config.experimental, "set_memory_growth",
                         side_effect=refusal) as grow, \
       caplog.at_level("WARNING"):
    distribute.grow_gpu_memory(FAKE_GPUS)
  assert grow.call_count == tries
  assert [r.getMessage() for r in caplog.records] == warnings


KIND = tf.distribute.experimental.CommunicationImplementation


@pytest.mark.parametrize("all_reduce,gpus,want", [
    ("auto", [], KIND.AUTO),  # ring on CPUs
    ("auto", FAKE_GPUS, KIND.NCCL),  # TensorFlow's AUTO would be ring
    ("ring", FAKE_GPUS, KIND.RING),  # workers sharing a GPU
    ("nccl", FAKE_GPUS, KIND.NCCL),
])
def test_the_all_reduce_is_nccl_between_gpus(all_reduce, gpus, want):
  assert distribute.communication(all_reduce, gpus).implementation == want


def test_multi_worker_is_built_with_the_all_reduce(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", TWO_WORKERS)
  with mock.patch.object(distribute, "_bound_cluster_waits"), \
       mock.patch.object(tf.distribute,
                         "MultiWorkerMirroredStrategy") as strategy:
    distribute._multi_worker(dist(), FAKE_GPUS)  # pylint: disable=protected-access
  options = strategy.call_args.kwargs["communication_options"]
  assert options.implementation == KIND.NCCL
