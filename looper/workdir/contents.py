"""What a checkpoint holds, read without restoring it; warm starts from it.

Synopsis::

    contents.items("/run/checkpoints/ckpt-500")    # {'model', 'step', ...}
    contents.variable_keys(prefix, "model")        # {'layer/kernel': key}
    contents.warm_start("/runs/a/checkpoints", {"model": model})

A checkpoint's object graph names each variable by its place under the
items the Trainer saved (`Trainer.checkpoint_items`): the Checkpointer asks
which items a workdir written by an earlier looper lacks, a warm start
matches another run's variables to this model's by place, and the tests
read a model's weights back by the same names. The `init` block (which
checkpoint a warm start reads) is declared here (`config()`).
"""

from typing import Any

from absl import logging
import ml_collections
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from looper import fields
from looper.errors import CheckpointError


def config() -> ml_collections.ConfigDict:
  """The `init` block: each field's default (its doc above it)."""
  c = ml_collections.ConfigDict()
  c.checkpoint = ""  # a checkpoint prefix or a checkpoints/ directory
  c.optimizer = fields.boolean(False)  # also restore the optimizer slots
  return c


def variable_keys(path: str, prefix: str) -> dict[str, str]:
  """{name: checkpoint key} of the variables under `prefix` (e.g. 'model').

  A checkpoint stores each variable once, under the first path that
  reaches it (a model's weights usually sit under `optimizer/`), so the
  names come from walking the object graph from `prefix`: the same names
  for the same model, whatever else the checkpoint holds.
  """
  graph = _object_graph(path)
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


def _object_graph(path: str) -> trackable_object_graph_pb2.TrackableObjectGraph:
  reader = tf.compat.v1.train.NewCheckpointReader(path)
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  return graph


def items(path: str) -> set[str]:
  """The names of the items checkpoint `path` holds ('model', 'step')."""
  return {child.local_name for child in _object_graph(path).nodes[0].children}


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
