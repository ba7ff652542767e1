"""The work of a train step: its FLOPs, counted once from its traced graph,
and, for sequences, its tokens.

Synopsis (what looper.train.loop does after its first call)::

    flops.per_step(loop_function, strategy)  # FLOPs of one step of every
                                             # replica; None: not static
    flops.of_graph(func_graph)               # of any traced graph
    flops.is_sequence(element_spec)          # int inputs [length]: tokens
    flops.tokens(batch)                      # a batch's (in the step)

What is counted: the multiply-adds of the contractions (matrix products,
einsums, convolutions and their gradients), 2 FLOPs each, of every
replica in the graph: the "model FLOPs" of PaLM's MFU (Chowdhery et al.
2022, appendix B; 6 x parameters x tokens for a transformer's matmuls plus
its attention). Elementwise work (activations, normalization, softmax,
the optimizer's update) is not: it runs on the vector units, not at the
matmul peak MFU is measured against, and is ~2% of what TensorFlow's
profiler counts for the LM and the MNIST CNN (tests/unit/measure/test_flops.py
checks the LM against PaLM's formula, the CNN and an LSTM against hand counts).

Why not TensorFlow's profiler (`tf.compat.v1.profiler.profile(graph,
options=ProfileOptionBuilder.float_operation())`), whose per-op rules
(tensorflow/python/profiler/internal/flops_registry.py) this follows? On
the traced train step (TF 2.21) it:
- does not look inside functions: the train loop's while body, a cond's
  branches, the XLA-compiled gradient function hold every matmul, so it
  counts ~0;
- has no rule for Einsum (Keras' MultiHeadAttention and EinsumDense are
  einsums: the LM's attention would count 0);
- reads BatchMatMulV2's transposes from attributes it does not have
  (`transpose_a`; the op's are `adj_x`/`adj_y`), so the gradient of a
  batched product with a transposed operand is counted with the wrong
  inner size;
- counts a convolution's input gradient over the input's positions, not
  the output's (+17% for a 3x3 'valid' convolution on 26x26);
- counts ops the runtime never runs: the gradient of the first layer with
  respect to the images, which nothing reads (TensorFlow prunes it).
Here: each function a graph calls is followed (a while loop's body times
its trip count when that is static; a cond's costlier branch), and only
the ops the outputs or a stateful op depend on count.

Per replica or global: a Mirrored train loop's graph holds each local
replica's step, so the count is this process' (all its replicas); the
run's global count is that times the workers (`replicas_in_sync / local
replicas`, each worker runs the same step). Under XLA (train.jit_compile)
the count is of the graph XLA compiles, before its fusions: the model's
FLOPs, which is what MFU divides by. With rematerialization (the LM's
model.remat, tf.recompute_grad) the recomputed forward pass is in the
graph and counts: the figure is then PaLM's hardware FLOPs (HFU), ~1/3
more for the blocks. With data.bucket the inputs' length is unknown when
traced: no count (None).
"""

import numpy as np
import tensorflow as tf

from looper import compat
from looper.data import batch as batch_lib

# Ops that call functions: the attributes naming them.
_BRANCHES = {"If": ("then_branch", "else_branch"),
             "StatelessIf": ("then_branch", "else_branch"),
             "Case": ("branches",), "StatelessCase": ("branches",)}
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")
_LOOPS = ("While", "StatelessWhile")


class Unknown(Exception):
  """A shape or a trip count the count needs is not static."""


def _size(shape: tf.TensorShape) -> int:
  if not shape.is_fully_defined():
    raise Unknown(f"shape {shape}")
  return int(np.prod(shape.as_list(), dtype=np.int64))


def _matmul(op) -> int:
  """Output elements x the inner size (of a, transposed or not)."""
  a = op.inputs[0].shape
  inner = a[0] if op.get_attr("transpose_a") else a[1]
  return _size(op.outputs[0].shape) * _size(tf.TensorShape([inner]))


def _batch_matmul(op) -> int:
  a = op.inputs[0].shape  # its transposition is `adj_x`, not `transpose_a`
  inner = a[-2] if op.get_attr("adj_x") else a[-1]
  return _size(op.outputs[0].shape) * _size(tf.TensorShape([inner]))


def _einsum(op) -> int:
  """Output elements x the sizes of the summed-over labels (each once)."""
  equation = op.get_attr("equation").decode()
  if "," not in equation:
    return 0  # one operand: a transpose or a sum, no products
  inputs, output = equation.replace("...", "").split("->")
  sizes = {}
  for labels, tensor in zip(inputs.split(","), op.inputs):
    if tensor.shape.rank is None:
      raise Unknown(f"rank of {tensor.name}")
    dims = tensor.shape.as_list()[tensor.shape.rank - len(labels):]
    sizes.update(zip(labels, dims))
  summed = [sizes[label] for label in set(sizes) - set(output)]
  return _size(op.outputs[0].shape) * _size(tf.TensorShape(summed))


def _conv(spatial_and_in):
  """A convolution's products: output elements x the filter elements
  that feed one (`spatial_and_in`: the filter's leading dims that do)."""
  def count(op) -> int:
    if "Backprop" not in op.type:
      out, kernel = op.outputs[0].shape, op.inputs[1].shape
    else:  # the forward output's gradient meets the filter: same products
      out = op.inputs[2].shape
      kernel = (op.outputs[0] if "Filter" in op.type else op.inputs[1]).shape
    return _size(out) * _size(kernel[:spatial_and_in(len(kernel))])
  return count


_conv_filter = _conv(lambda rank: rank - 1)  # [kh, kw, in] of [.., in, out]
_depthwise = _conv(lambda rank: rank - 2)  # [kh, kw] of [.., in, multiplier]

# Op type -> its multiply-adds.
CONTRACTIONS = {
    "MatMul": _matmul,
    "BatchMatMul": _batch_matmul, "BatchMatMulV2": _batch_matmul,
    "BatchMatMulV3": _batch_matmul,
    "Einsum": _einsum,
    **{name: _conv_filter for name in (
        "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
        "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2")},
    **{name: _depthwise for name in (
        "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter")},
}


def _function_graph(graph, name: str):
  """The traced graph of the function `name` a node of `graph` calls."""
  called = compat.function_graph(graph, name)
  if called is None:
    raise Unknown(f"function {name} not found with its graph")
  return called


def _live(graph) -> list:
  """The ops that run: what the outputs and the stateful ops depend on
  (TensorFlow prunes the rest of a function)."""
  ops = graph.get_operations()
  todo = [t.op for t in graph.outputs] + list(
      getattr(graph, "control_outputs", ())) + [
          op for op in ops if op.op_def.is_stateful]
  live = set()
  while todo:
    op = todo.pop()
    if op in live:
      continue
    live.add(op)
    todo += [t.op for t in op.inputs] + list(op.control_inputs)
  return [op for op in ops if op in live]


def _static(tensor):
  """`tensor`'s value if static: TensorFlow's constant folding, and the
  max or min of static values (Keras' RNN loop's trip count)."""
  value = tf.get_static_value(tensor)
  reduce = {"Max": np.max, "Min": np.min}.get(tensor.op.type)
  if value is None and reduce is not None:
    values, axes = [tf.get_static_value(t) for t in tensor.op.inputs]
    if values is not None and axes is not None:
      value = reduce(values, axis=tuple(np.reshape(axes, [-1])))
  return value


def _trips(op) -> int:
  """A while loop's trip count if static (while_v2's maximum_iterations)."""
  limit = _static(op.inputs[1])
  if limit is None or limit < 0:
    raise Unknown(f"trip count of {op.name}")
  return int(limit)


def of_graph(graph) -> int:
  """2 x the multiply-adds of the ops of `graph` that run (module doc);
  raises Unknown if a shape or trip count it needs is not static."""
  total = 0
  for op in _live(graph):
    if op.type in CONTRACTIONS:
      total += 2 * CONTRACTIONS[op.type](op)
    elif op.type in _CALLS:
      total += of_graph(_function_graph(graph, op.get_attr("f").name))
    elif op.type in _BRANCHES:
      names = [f.name for attr in _BRANCHES[op.type]
               for f in _as_list(op.get_attr(attr))]
      total += max(of_graph(_function_graph(graph, n)) for n in names)
    elif op.type in _LOOPS:
      total += _trips(op) * of_graph(
          _function_graph(graph, op.get_attr("body").name))
  return total


def _as_list(value) -> list:
  return value if isinstance(value, list) else [value]


def graph_replicas(strategy: tf.distribute.Strategy) -> int:
  """How many replicas' steps one process' traced train loop holds: its
  devices under Mirrored and MultiWorkerMirrored; one under TPUStrategy
  (TPU replication happens in the compiler) and the default strategy."""
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return 1
  try:
    return len(strategy.extended.worker_devices)
  except RuntimeError:  # the default strategy
    return 1


def per_step(function, strategy: tf.distribute.Strategy) -> float | None:
  """FLOPs of one step of all replicas (every worker's) of the traced
  train loop `function` (a concrete function of looper.train.loop's: a
  while loop holding one step per iteration, or one step); None if a
  shape is not static (data.bucket)."""
  graph = function.graph
  loops = [op for op in graph.get_operations() if op.type in _LOOPS]
  try:
    counted = of_graph(_function_graph(graph, loops[0].get_attr("body").name)
                       if loops else graph)
  except Unknown:
    return None
  return counted * strategy.num_replicas_in_sync / graph_replicas(strategy)


def is_sequence(element_spec) -> bool:
  """Whether examples of `element_spec` are sequences: one int input per
  example of rank 1 (token ids), whose throughput is in tokens."""
  inputs = batch_lib.parts(element_spec)[0]
  return (isinstance(inputs, tf.TensorSpec) and inputs.dtype.is_integer and
          inputs.shape.rank == 1)


def tokens(batch) -> tf.Tensor:
  """The tokens of a batch of sequences: the sum of the weights if each
  token has one (the real ones: padding weighs 0), else batch x length."""
  inputs, _, weights = batch_lib.parts(batch)
  if isinstance(weights, tf.Tensor) and weights.shape.rank == 2:
    return tf.reduce_sum(tf.cast(weights, tf.float32))
  return tf.cast(tf.size(inputs), tf.float32)


def describe(counted: float | None) -> str:
  """The log line of a count (once per run)."""
  if counted is None:
    return ("FLOPs per train step: not counted, an input's length is unknown"
            " when traced (data.bucket); no flops_per_sec or mfu")
  return (f"FLOPs per train step: {counted:.4g} (counted once from its graph:"
          " the matmuls, einsums and convolutions, forward and backward, of"
          " every replica)")
