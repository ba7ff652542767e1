"""The train loop's graph under Mirrored(2): a body that never makes the host
wait for a device.

Traced on 2 logical CPUs (the test session's), the loop is read as the
GPU/TPU would run it: inside the while body and outside the replica step
(the `REPLICA_STEP` name scope) there may be no read of a model or optimizer
variable, no collective, and nothing may flow out of the replica step (a
per-step loss reduced or fetched); the only variable the loop reads is the
stop flag, a host variable, in its condition. With
optimizer.clip_global_norm the replica step holds ONE all-reduce, as
without it; distribution.shard_optimizer adds ONE all-gather (one
collective). The replica step writes whole variables only (a slice of a TPU
variable is a tensor, with no assign), and the weight average adds no
merge call (a merge call and a broadcast per variable per step before).
Every case has the health figures on (train.health_metrics, the default,
and train.grad_norm):
their per-update sums add no collective, merge call or read to the body
against a loop without them (`unwatched`).
Under MultiWorkerMirroredStrategy (2 workers on 127.0.0.1) the body holds
no collective outside the replica step either: tf.distribute's per-step
"has every worker data?" all-reduce stays off (the streams are endless).

    python -m tests.e2e.replicas.test_loop_graph  # what the test asserts on
"""

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures import forks
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV

# A process of its own (2 logical CPUs): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

WATCHED = {"train.grad_norm": True}  # every health figure
CASES = {"plain": WATCHED, "unwatched": {"train.health_metrics": False},
         "clipped": {**WATCHED, "optimizer.clip_global_norm": 1.0},
         "accumulated": {**WATCHED, "train.grad_accum_steps": 2,
                         "optimizer.clip_global_norm": 1.0},
         "averaged": {**WATCHED, "optimizer.ema_decay": 0.9},
         "float16": {**WATCHED, "train.precision": "mixed_float16",
                     "optimizer.clip_global_norm": 1.0},
         "sharded": {**WATCHED, "distribution.shard_optimizer": True,
                     "optimizer.ema_decay": 0.9,
                     "optimizer.clip_global_norm": 1.0}}


def _functions_of(graph) -> dict:
  return {f.signature.name: f for f in graph.as_graph_def().library.function}


def _walk(fdef, library, out) -> None:
  """Every node of `fdef` and of the functions it calls (cond branches),
  with the function holding it."""
  for node in fdef.node_def:
    out.append((fdef, node))
    for value in node.attr.values():
      names = [value.func.name] if value.HasField("func") else []
      for name in names + [f.name for f in value.list.func]:
        if name in library:
          _walk(library[name], library, out)


def loop_facts(fields: dict) -> dict:
  """What the while body of tiny's train loop does outside the replica step."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from looper.train import loop as loop_lib  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  from tests.fixtures import tiny  # pylint: disable=g-import-not-at-top
  from tests.fixtures.configs import configured  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import distribute_lib  # pylint: disable=g-import-not-at-top
  config = configured(tiny.get_config(), fields)
  trainer = pieces.trainer(config, distribute.strategy_for(config.distribution))
  merge_calls = []
  merge_call = distribute_lib.ReplicaContext.merge_call
  def counted(context, *args, **kwargs):
    merge_calls.append(1)
    return merge_call(context, *args, **kwargs)
  distribute_lib.ReplicaContext.merge_call = counted
  try:
    function = trainer._loop.function.get_concrete_function(  # pylint: disable=protected-access
        trainer.input.train_iterator(), tf.TensorSpec([], tf.int32))
  finally:
    distribute_lib.ReplicaContext.merge_call = merge_call
  graph = function.graph
  library = _functions_of(graph)
  (loop,) = [op for op in graph.get_operations() if op.type == "While"]
  body = library[loop.get_attr("body").name]
  # Which variable each resource input of the body is (by the capture).
  labels = {}
  for name, variables in (("stop flag", [trainer.stop.flag]),
                          ("model", trainer.model.variables),
                          ("optimizer", trainer.optimizer.variables)):
    for variable in variables:
      for component in getattr(variable, "values", (variable,)):
        handle = getattr(component, "handle", None)
        if handle is not None:
          labels[id(handle)] = name
  captured = {id(internal): labels.get(id(external), "other")
              for external, internal in graph.captures}
  arg_label = {arg.name: captured.get(id(loop.inputs[i]), "loop value")
               for i, arg in enumerate(body.signature.input_arg)}
  cond = library[loop.get_attr("cond").name]
  cond_label = {arg.name: captured.get(id(loop.inputs[i]), "loop value")
                for i, arg in enumerate(cond.signature.input_arg)}
  nodes = []
  _walk(body, library, nodes)
  step = loop_lib.REPLICA_STEP

  def in_step(name: str) -> bool:
    return f"{step}/" in name or name.startswith(f"{step}")

  step_nodes = {(id(f), n.name) for f, n in nodes if in_step(n.name)}
  facts = {"reads": [], "collectives_outside": [], "out_of_step": [],
           "collectives_per_replica": {}, "merge_calls": len(merge_calls),
           "sliced_assigns": [n.name for _, n in nodes
                              if n.op == "ResourceStridedSliceAssign"],
           "cond_reads": [cond_label.get(n.input[0].split(":")[0], "nested")
                          for n in cond.node_def
                          if n.op == "ReadVariableOp"]}
  for fdef, node in nodes:
    if "Collective" in node.op or "AllReduce" in node.op:
      if in_step(node.name):
        device = node.device.rsplit(":", 1)[-1]
        facts["collectives_per_replica"][device] = (
            facts["collectives_per_replica"].get(device, 0) + 1)
      else:
        facts["collectives_outside"].append(node.name)
    if in_step(node.name):
      continue
    if node.op in ("ReadVariableOp", "ResourceGather", "VariableShape"):
      source = node.input[0].split(":")[0]
      facts["reads"].append(arg_label.get(source, f"{source} (nested)")
                            if fdef is body else f"{node.name} (nested)")
    # Data edges only: TensorFlow orders every stateful op of an iteration
    # before the next by control edges, in any tf.function loop (on a GPU
    # or TPU an op is done once its kernel is queued).
    for source in node.input:
      if (not source.startswith("^") and
          (id(fdef), source.split(":")[0]) in step_nodes):
        facts["out_of_step"].append(f"{node.name} <- {source}")
  for fdef, _ in nodes:  # a function returning what the step computed
    for key, value in fdef.ret.items():
      if (id(fdef), value.split(":")[0]) in step_nodes:
        facts["out_of_step"].append(f"{fdef.signature.name} returns {key}")
  return facts


def _facts(*args, env=None):
  return forks.popen(
      [sys.executable, "-m", "tests.e2e.replicas.test_loop_graph", *args],
      cwd=ROOT,
      env={**os.environ, "PYTHONPATH": PYTHONPATH, **LOOPBACK_ENV,
           **(env or {})},
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read(proc) -> dict:
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  return json.loads(out.splitlines()[-1])


def mirrored_facts() -> dict:
  """loop_facts of every case on the session's 2 logical CPUs."""
  return {case: loop_facts({"distribution.num_cpu_devices": 2, **fields})
          for case, fields in CASES.items()}


def test_the_loop_body_is_next_and_the_replica_step_only():
  facts = mirrored_facts()
  for case, got in facts.items():
    assert got["reads"] == [], case
    assert got["cond_reads"] == ["stop flag"], case
    assert got["collectives_outside"] == [], case
    assert got["out_of_step"] == [], case
    assert got["sliced_assigns"] == [], case
    # The gradient all-reduce (clipping's included) once per replica; the
    # float16 case adds the finiteness vote (a scalar), the sharded one
    # the all-gather of the new weights, one for all (tiny's are small:
    # sharding.ALONE).
    want = {"float16": 2, "sharded": 2}.get(case, 1)
    assert got["collectives_per_replica"] == {"0": want, "1": want}, case
  # The weight average's per-replica assigns add no merge call, nor do the
  # health figures' sums.
  assert facts["averaged"]["merge_calls"] == facts["plain"]["merge_calls"]
  assert facts["unwatched"] == facts["plain"]


def test_no_collective_between_workers_outside_the_replica_step():
  from looper.cli.launch import free_ports  # pylint: disable=g-import-not-at-top
  cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
  workers = [_facts("worker", env={"TF_CONFIG": json.dumps(
      {"cluster": cluster, "task": {"type": "worker", "index": i}})})
             for i in range(2)]
  try:
    for got in map(_read, workers):
      assert got["collectives_outside"] == [], got
      assert got["reads"] == [] and got["out_of_step"] == [], got
      assert got["collectives_per_replica"] == {"0": 1}, got
  finally:
    for proc in workers:
      proc.kill()


if __name__ == "__main__":
  if sys.argv[1:] == ["worker"]:  # one replica per worker process
    print(json.dumps(loop_facts({"distribution.strategy": "multi_worker"})))
  else:
    print(json.dumps(mirrored_facts()))
