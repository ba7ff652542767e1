"""Strategy choice, the TPU path (real resolver, mocked TPU system), chief."""

import json
import os
import re
import socket
from unittest import mock

import pytest
import tensorflow as tf

from looper import config as lc
from looper import network
from looper.options import cluster
from looper.options import distribute
from looper.options import slurm
from tests.fixtures import catalogue
from tests.fixtures.configs import SESSION_CPUS
from tests.fixtures.processes import LOST_WORKER_1


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
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "tf-config-not-json", value="'{not json'")):
    distribute.choose(dist(), num_gpus=0)


def test_multi_worker_needs_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  c = lc.default_config()
  c.distribution.strategy = "multi_worker"
  with pytest.raises(lc.ConfigError,
                     match=catalogue.line("multi-worker-without-tf-config")):
    distribute.strategy_for(c.distribution)


def test_tpu_path_resolves_connects_initializes(monkeypatch):
  """The real TPUClusterResolver on a loopback address; TPU calls mocked."""
  c = lc.default_config()
  c.distribution.strategy = "tpu"
  c.distribution.tpu = "grpc://127.0.0.1:8470"
  with mock.patch.object(tf.config, "experimental_connect_to_cluster") as con, \
       mock.patch.object(tf.tpu.experimental, "initialize_tpu_system") as init, \
       mock.patch.object(tf.distribute, "TPUStrategy") as strategy:
    assert distribute.strategy_for(c.distribution) is strategy.return_value
  resolver = con.call_args.args[0]
  assert isinstance(resolver, tf.distribute.cluster_resolver.TPUClusterResolver)
  assert resolver.master() == "grpc://127.0.0.1:8470"
  init.assert_called_once_with(resolver)
  strategy.assert_called_once_with(resolver)


def test_cpu_devices_cannot_change_after_start():
  tf.constant(1)  # TensorFlow has started (the session's 2 CPU devices)
  distribute.split_cpu(SESSION_CPUS)  # the same count again: fine
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "cpu-devices-after-start", asked=3, have=SESSION_CPUS)):
    distribute.split_cpu(3)


def test_one_mirrored_strategy_per_device_set_in_a_process():
  """A second MirroredStrategy over the same devices numbers its
  all-reduces from the first's collective keys, and once both have run
  they clash ("Shape mismatch in the collective instance 100": two 2-replica
  runs in one notebook); looper keeps one per device set."""
  devices = distribute.split_cpu(SESSION_CPUS)
  assert distribute.mirrored(devices) is distribute.mirrored(list(devices))
  assert distribute.mirrored(devices[:1]) is not distribute.mirrored(devices)


def test_a_worker_that_lost_the_chief_names_it():
  """The text a worker got when the chief's host was cut
  (tests/e2e/multiworker/test_hosts.py
  records it live): its heartbeats to the chief's service timed out."""
  from looper import errors  # pylint: disable=g-import-not-at-top
  e = tf.errors.DeadlineExceededError(None, None, (
      "Graph execution error:\n\nDetected at node while/CollectiveReduceV2"
      "\n\nCollective ops is aborted by: Deadline Exceeded\n\nRPC:"
      " /tensorflow.CoordinationService/Heartbeat\nThe error could be from a"
      " previous operation. Restart your program to reset.\n\t [[{{node"
      " while/CollectiveReduceV2}}]] [Op:__inference__train_loop_961]"))
  assert re.fullmatch(catalogue.line(
      "lost-the-chief", task="/job:worker/replica:0/task:0", secs=8),
                      errors.cluster_error(
                          e, 8, leader="/job:worker/replica:0/task:0"))
  assert errors.cluster_error(e, 8, leader=None) is None  # not multi-worker


def test_a_worker_refused_by_a_killed_one_names_it():
  """A survivor whose next RecvBuf dialled the killed worker's closed port
  (gRPC's text for it): the lost worker, the line the test of a killed
  worker accepts (tests/e2e/multiworker/test_multiworker_faults.py)."""
  from looper import errors  # pylint: disable=g-import-not-at-top
  e = tf.errors.UnavailableError(None, None, (
      "Graph execution error:\n\nDetected at node while/CollectiveReduceV2"
      "\n\nfailed to connect to all addresses; last error: UNKNOWN:"
      " ipv4:127.0.0.1:41653: Failed to connect to remote host: Connection"
      " refused\nAdditional GRPC error information from remote target"
      " /job:worker/replica:0/task:1 while calling"
      " /tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received from peer"
      "  {grpc_message:\"failed to connect to all addresses; last error:"
      " UNKNOWN: ipv4:127.0.0.1:41653: Failed to connect to remote host:"
      " Connection refused\", grpc_status:14}\n\t [[{{node"
      " while/CollectiveReduceV2}}]] [Op:__inference__train_loop_961]"))
  line = errors.cluster_error(e, 8, leader="/job:worker/replica:0/task:0")
  assert re.fullmatch(catalogue.line(
      "lost-worker", task="/job:worker/replica:0/task:1",
      why="Connection refused"), line)
  assert re.fullmatch(LOST_WORKER_1, "looper: " + line)


FAKE_GPUS = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
             for i in range(2)]


def test_every_gpu_grows_its_memory_before_the_strategy():
  c = lc.default_config()
  c.distribution.strategy = "default"
  with mock.patch.object(tf.config, "list_physical_devices",
                         lambda kind: FAKE_GPUS if kind == "GPU" else []), \
       mock.patch.object(tf.config.experimental, "set_memory_growth") as grow:
    distribute.strategy_for(c.distribution)
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
  monkeypatch.setattr(network, "addresses", lambda: ["127.0.0.1", "10.1.2.3"])
  with mock.patch.object(cluster, "bound_waits"), \
       mock.patch.object(tf.distribute,
                         "MultiWorkerMirroredStrategy") as strategy:
    distribute._multi_worker(dist(), FAKE_GPUS)  # pylint: disable=protected-access
  options = strategy.call_args.kwargs["communication_options"]
  assert options.implementation == KIND.NCCL


# --- Who may reach a worker's server (distribution.network, looper.network):
# the machine's addresses and the names given here, none read from the host.


def _cluster_of(monkeypatch, machine, task, names):
  """TF_CONFIG naming `task` (and a peer), on a machine with the addresses
  `machine`, where each cluster name resolves as `names` says."""
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": {"worker": [task, "peer:2222"]},
       "task": {"type": "worker", "index": 0}}))
  monkeypatch.setattr(network, "addresses", lambda: machine)
  monkeypatch.setattr(network, "resolve", lambda host: names[host])


@pytest.mark.parametrize("reach, machine, task, names, refused", [
    # `looper launch`'s workers (it declares loopback), on a LAN host:
    ("loopback", ["127.0.0.1", "::1"], "127.0.0.1:7", {"127.0.0.1":
                                                      ["127.0.0.1"]}, None),
    ("loopback", ["127.0.0.1", "192.168.1.20", "fe80::1"], "127.0.0.1:7",
     {"127.0.0.1": ["127.0.0.1"]},
     catalogue.line("network-other-addresses",
                    addresses="192.168.1.20, fe80::1")),
    # TF_CONFIG's or a Slurm step's machines (the default, private):
    ("private", ["127.0.0.1", "198.18.1.1", "fe80::1"], "198.18.1.1:7470",
     {"198.18.1.1": ["198.18.1.1"]}, None),  # tests/hosts.py's namespaces
    ("private", ["127.0.0.1", "10.0.0.9"], "n9:18720", {"n9": ["10.0.0.9"]},
     None),
    ("private", ["127.0.0.1", "10.0.0.9"], "n9:18720", {"n9": []}, None),
    ("private", ["127.0.0.1", "10.0.0.9", "2001:db8:1::9"], "n9:18720",
     {"n9": ["10.0.0.9"]}, None),  # a documentation range: not global
    ("private", ["127.0.0.1", "10.0.0.9", "2600:1f18::9"], "n9:18720",
     {"n9": ["10.0.0.9"]},
     catalogue.line("network-global-addresses", addresses="2600:1f18::9")),
    # A cloud VM named at its public address (NAT: not on its interfaces):
    ("private", ["127.0.0.1", "10.128.0.2"], "vm-0:2222",
     {"vm-0": ["34.1.2.3"]}, catalogue.line(
         "network-named-beyond", where="vm-0:2222", address="34.1.2.3")),
])
def test_a_worker_starts_its_server_only_within_its_declared_reach(
    monkeypatch, reach, machine, task, names, refused):
  _cluster_of(monkeypatch, machine, task, names)
  with mock.patch.object(cluster, "bound_waits"), \
       mock.patch.object(tf.distribute,
                         "MultiWorkerMirroredStrategy") as strategy:
    if refused is None:
      distribute._multi_worker(dist(network=reach), [])  # pylint: disable=protected-access
      strategy.assert_called_once()
      return
    with pytest.raises(lc.ConfigError, match=refused):
      distribute._multi_worker(dist(network=reach), [])  # pylint: disable=protected-access
  strategy.assert_not_called()  # no server was started


@pytest.mark.parametrize("task, named", [
    (None, "type None, index None"),
    ({"type": "worker", "index": 2}, "type 'worker', index 2"),
])
def test_a_tf_config_without_this_task_is_one_line(monkeypatch, task, named):
  tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                          **({"task": task} if task else {})})
  monkeypatch.setenv("TF_CONFIG", tf_config)
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "tf-config-task-not-in-cluster", value=repr(tf_config), task=named)):
    distribute.check_reach("private")


def test_a_public_worker_says_once_what_it_opens(monkeypatch, caplog):
  _cluster_of(monkeypatch, ["127.0.0.1", "34.1.2.3"], "34.1.2.3:2222",
              {"34.1.2.3": ["34.1.2.3"]})
  with caplog.at_level("WARNING"):
    distribute.check_reach("public")
  assert [r.getMessage() for r in caplog.records] == [
      "config.distribution.network='public': this worker's TensorFlow server"
      " listens on every address of this machine without authentication:"
      " whoever reaches it can run TensorFlow ops as this process (its files,"
      " the run's collectives); keep a firewall that admits only the run's"
      " machines"]


# --- Slurm: a step's environment as one cluster (looper.options.slurm). A real
# Slurm runs looper in tests/e2e/multiworker/test_slurm.py; here each
# variable's reading.

NODES = {"n[9-10]": ("n9", "n10"), "vm": ("vm",)}  # as scontrol expands them


@pytest.fixture
def nodes(monkeypatch):
  monkeypatch.setattr(slurm, "hostnames", NODES.__getitem__)


def step_env(rank, local, node, nodelist="n[9-10]", tasks="2(x2)", **more):
  """A task's SLURM_* variables as srun sets them (job 4242, step 0)."""
  env = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
         "SLURMD_NODENAME": node, "SLURM_STEP_NODELIST": nodelist,
         "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_JOB_ID": "4242",
         "SLURM_STEP_ID": "0"}
  env["SLURM_STEP_NUM_TASKS"] = env["SLURM_NTASKS"] = str(
      sum(slurm.tasks_per_node(tasks)))
  return {**env, **more}


# Block order: ranks 0, 1 on n9, then 2, 3 on n10. Ports by the rule
# 16384 + 16 * ((job + 31 * step) mod 1024): (4242 + 0) mod 1024 = 146 for
# step 0, (4242 + 93) mod 1024 = 239 for step 3.
@pytest.mark.parametrize("step,port", [("0", 18720), ("3", 20208)])
def test_a_slurm_step_is_one_cluster_in_slurms_node_order(nodes, step, port):
  for rank, (node, local) in enumerate([("n9", 0), ("n9", 1), ("n10", 0),
                                        ("n10", 1)]):
    env = step_env(rank, local, node, SLURM_STEP_ID=step)
    slurm.join_step("auto", env)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": [f"n9:{port}", f"n9:{port + 1}",
                               f"n10:{port}", f"n10:{port + 1}"]},
        "task": {"type": "worker", "index": rank}}


def test_tensorflows_slurm_resolver_misplaces_tasks_and_fails_on_cpus(
    monkeypatch, tmp_path):
  """Why looper builds TF_CONFIG itself (looper.options.slurm's doc)."""
  for name, value in step_env(0, 0, "n9").items():
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  resolver = tf.distribute.cluster_resolver.SlurmClusterResolver
  # Told of one GPU per task, it sorts the nodes by name: Slurm's task 0
  # runs on n9, TensorFlow puts it at n10.
  spec = resolver(port_base=18720, gpus_per_node=2, gpus_per_task=1,
                  auto_set_gpu=False).cluster_spec().as_dict()
  assert spec == {"worker": ["n10:18720", "n10:18721", "n9:18720",
                             "n9:18721"]}
  with pytest.raises(ValueError):  # told of no GPUs
    resolver(port_base=18720, gpus_per_node=0).cluster_spec()
  monkeypatch.setenv("PATH", str(tmp_path))  # a CPU node: no nvidia-smi
  with pytest.raises(FileNotFoundError):
    resolver()


def test_ports_slurm_reserved_come_first(nodes):
  env = step_env(3, 1, "n10", SLURM_STEP_RESV_PORTS="12001-12003")
  slurm.join_step("multi_worker", env)
  assert json.loads(env["TF_CONFIG"])["cluster"]["worker"] == [
      "n9:12001", "n9:12002", "n10:12001", "n10:12002"]


@pytest.mark.parametrize("env,error", [
    (step_env(1, 0, "n10"), "SLURM_PROCID=1 runs on n10 as its task 0, but"
     " looper places rank 1 on n9 as task 1 (Slurm's block order); run srun"
     " with --distribution=block (the default)"),
    (step_env(0, 0, "n9", SLURM_STEP_RESV_PORTS="12001"),
     "SLURM_STEP_RESV_PORTS=12001 holds 1 ports for up to 2 tasks on a node;"
     " run srun with --resv-ports=2"),
    (step_env(0, 0, "vm", "vm", "17"), "17 tasks on a node: looper's port"
     " rule gives a step 16 ports per node; reserve Slurm's own with srun"
     " --resv-ports (slurm.conf MpiParams=ports=12000-12999)"),
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "7"},
     "SLURM_NTASKS=2: this Slurm job has several tasks but looper runs as"
     " one process outside srun (the batch script itself); start it with"
     " `srun python -m looper.main ...`, or give the job --ntasks=1"),
], ids=["cyclic", "few-reserved-ports", "17-per-node", "outside-srun"])
def test_a_misconfigured_slurm_step_is_one_line(nodes, env, error):
  with pytest.raises(lc.ConfigError) as raised:
    slurm.join_step("auto", env)
  assert str(raised.value) == error
  assert "TF_CONFIG" not in env


def test_a_one_process_strategy_under_srun_is_one_line(nodes):
  with pytest.raises(lc.ConfigError) as raised:
    slurm.join_step("mirrored", step_env(0, 0, "n9"))
  assert str(raised.value) == (
      "config.distribution.strategy='mirrored' trains in one process, but"
      " srun started 4 tasks: each would train alone; set"
      " --config.distribution.strategy=auto, or run srun --ntasks=1")


@pytest.mark.parametrize("env", [
    {},  # not under Slurm
    {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"},  # a one-task job's script
    step_env(0, 0, "vm", "vm", "1"),  # srun -n1
    step_env(0, 0, "n9", TF_CONFIG=TWO_WORKERS),  # the user's own cluster
], ids=["no-slurm", "one-task-job", "srun-n1", "tf-config"])
def test_one_task_or_a_users_tf_config_is_left_as_it_is(nodes, env):
  before = dict(env)
  assert slurm.join_step("mirrored", env) == 1
  assert env == before


def test_a_port_another_step_holds_is_one_line(nodes):
  env = step_env(0, 0, "vm", "vm", "2")
  with socket.socket() as taken:
    taken.bind(("", 18720))
    taken.listen()
    with pytest.raises(lc.ConfigError) as raised:
      slurm.join_step("auto", env)
  assert str(raised.value) == (
      "port 18720 of Slurm step 4242.0 (task 0) is taken on vm (Address"
      " already in use): another job's step got the same ports; reserve"
      " Slurm's own with srun --resv-ports (slurm.conf"
      " MpiParams=ports=12000-12999), or rerun")


# (CUDA_VISIBLE_DEVICES as Slurm set it, SLURM_GPUS_PER_TASK, this task's
# local index of 2 on its node; None: unset) -> what the task uses, how many
# tasks share them.
@pytest.mark.parametrize("listed,per_task,local,want,sharing", [
    ("0,1,2,3", None, 1, "2,3", 1),  # --gres=gpu:4: half each
    ("4,5", None, 0, "4", 1),
    ("GPU-a1,GPU-b2", None, 1, "GPU-b2", 1),
    ("3", "1", 1, "3", 1),  # --gpus-per-task=1: Slurm bound it already
    ("0,1,2", None, 0, "0,1,2", 2),  # no even split: both use all
    (None, None, 0, None, 2),  # no --gres: TensorFlow's count decides
    ("", None, 1, "", 1),  # no GPU
], ids=["gres-4", "gres-2", "uuids", "gpus-per-task", "uneven", "no-gres",
        "no-gpu"])
def test_each_task_gets_its_share_of_the_nodes_gpus(nodes, listed, per_task,
                                                    local, want, sharing):
  env = step_env(local, local, "vm", "vm", "2")
  for name, value in (("CUDA_VISIBLE_DEVICES", listed),
                      ("SLURM_GPUS_PER_TASK", per_task)):
    if value is not None:
      env[name] = value
  assert slurm.join_step("auto", env) == sharing
  assert env.get("CUDA_VISIBLE_DEVICES") == want


def test_tasks_sharing_gpus_all_reduce_over_ring(monkeypatch, nodes, caplog):
  monkeypatch.setenv("TF_CONFIG", "")  # unset, and unset again after
  monkeypatch.setattr(network, "addresses", lambda: ["127.0.0.1", "10.0.0.9"])
  monkeypatch.setattr(network, "resolve", lambda host: ["10.0.0.9"])
  for name, value in step_env(1, 1, "vm", "vm", "2").items():
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  c = lc.default_config()
  with mock.patch.object(tf.config, "list_physical_devices",
                         lambda kind: FAKE_GPUS if kind == "GPU" else []), \
       mock.patch.object(tf.config.experimental, "set_memory_growth"), \
       mock.patch.object(cluster, "bound_waits"), \
       mock.patch.object(tf.distribute,
                         "MultiWorkerMirroredStrategy") as strategy, \
       caplog.at_level("WARNING"):
    distribute.strategy_for(c.distribution)
  assert json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1
  options = strategy.call_args.kwargs["communication_options"]
  assert options.implementation == KIND.RING
  assert c.distribution.all_reduce == "ring"  # as config.json will say
  assert [r.getMessage() for r in caplog.records] == [
      "2 GPU(s) shared by the 2 tasks of this node (not an even split):"
      " every task uses all of them (memory grows as needed; ring"
      " all-reduce, as NCCL refuses two workers on one GPU); for one share"
      " each, run srun with --gpus-per-task or a --ntasks-per-node that"
      " divides 2"]
