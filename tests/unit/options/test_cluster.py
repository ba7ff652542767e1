"""looper.options.cluster: TF_CONFIG's training tasks, the coordination
leader, this task's index, a TPU's cores and the warning on its batch per
core."""

import json
import re
import types
from unittest import mock

import pytest
import tensorflow as tf

from looper import config as lc
from looper.options import cluster
from tests.fixtures import catalogue


def dist(**fields):
  c = lc.default_config().distribution
  c.update(fields)
  return c


def _strategy(spec, task_type, task_id):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(spec), task_type=task_type, task_id=task_id)
  return types.SimpleNamespace(cluster_resolver=resolver)


@pytest.mark.parametrize("spec,task_type,task_id", [
    ({"worker": ["a:1", "b:1"]}, "worker", 1),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0),
])
def test_task_id(spec, task_type, task_id):
  assert cluster.task_id(_strategy(spec, task_type, task_id)) == task_id
  assert cluster.task_id(tf.distribute.get_strategy()) == 0


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
  assert cluster.size() == size
  assert cluster.coordination_leader() == leader


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
  assert cluster.tpu_batch_warning(batch, cores) == warning
  if warning:
    assert re.fullmatch(catalogue.line("tpu-batch-per-core", batch=batch,
                                       cores=cores), warning)


def test_tpu_cores_come_from_the_strategy_or_the_dry_run_field():
  assert cluster.tpu_cores(tf.distribute.get_strategy(), dist()) == 0
  assert cluster.tpu_cores(tf.distribute.get_strategy(),
                           dist(tpu_cores=32)) == 32
  tpu = mock.create_autospec(tf.distribute.TPUStrategy, instance=True)
  tpu.num_replicas_in_sync = 8
  assert cluster.tpu_cores(tpu, dist(tpu_cores=32)) == 8


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_a_dry_run_warns_about_the_batch_per_core(tmp_path, caplog):
  from looper import run  # pylint: disable=g-import-not-at-top
  from tests.fixtures import tiny  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  c.train.steps, c.distribution.tpu_cores = 1, 8
  with caplog.at_level("WARNING"):
    run.run(c, str(tmp_path), "train")
  assert any(r.getMessage().startswith(
      "config.train.batch_size=32 gives 4 examples per TPU core (8 cores)")
             for r in caplog.records)


@pytest.mark.parametrize("spec,leader", [
    ({"worker": ["a:1", "b:1"]}, "/job:worker/replica:0/task:0"),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "/job:chief/replica:0/task:0"),
    (None, None),
])
def test_the_coordination_leader_is_the_chief(monkeypatch, spec, leader):
  if spec is None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
  else:
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": spec, "task": {"type": "worker", "index": 0}}))
  assert cluster.coordination_leader() == leader
