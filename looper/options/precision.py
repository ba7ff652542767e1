"""Mixed precision (dtype policy, loss scaling, all-replica check); determinism.

Synopsis::

    with precision.policy("mixed_bfloat16"):       # only while building
      model = model_fn(config)                      # layers keep the policy
    optimizer = precision.wrap(optimizer, "mixed_float16")  # loss scaling
    scaled = precision.scale_loss(optimizer, loss)  # inside the tape
    grads = precision.skip_unless_finite_everywhere(optimizer, grads)
    precision.set_deterministic(config.train.deterministic)  # before any op

`train.precision` (the table PRECISIONS, which `config.validate` reads):
  float32         everything float32.
  mixed_bfloat16  compute in bfloat16, variables float32; no loss scaling
                  (bfloat16 has float32's range). 1.6-1.9x faster for the
                  MNIST CNN on a CPU with AMX, 1.4x with AVX-512 BF16,
                  ~0.7x on one with neither; the usual choice on TPU.
  mixed_float16   compute in float16 with Keras' dynamic LossScaleOptimizer
                  (GPUs). About 170x slower on this CPU: for GPUs only.

Variables stay float32 under every policy, so checkpoints of model weights
and optimizer slots are the same whatever the precision. Keras 3's
LossScaleOptimizer decides "finite" from replica 0's gradients alone under
tf.distribute: an inf on replica 1 would reach the weights. Here every
replica votes (one scalar all-reduce) and a non-finite gradient anywhere
makes all replicas skip the update and lower the scale.

`train.deterministic` (`set_deterministic`, process-wide): op determinism
and no TensorFloat-32, for the exact contracts on GPUs.

`slower_here` says when the chosen precision is slower than float32 on the
machine at hand (the run's header and `looper describe` show it).
"""

import contextlib
import dataclasses

import keras
import numpy as np
import tensorflow as tf

from looper import compat


@dataclasses.dataclass(frozen=True)
class Precision:
  policy: str  # the Keras dtype policy the model's layers are built under
  loss_scaling: bool  # wrap the optimizer in Keras' LossScaleOptimizer


# `train.precision` -> how the model is built and the optimizer wrapped.
PRECISIONS = {
    "float32": Precision("float32", loss_scaling=False),
    "mixed_bfloat16": Precision("mixed_bfloat16", loss_scaling=False),
    "mixed_float16": Precision("mixed_float16", loss_scaling=True),
}


# CPU flags of the bfloat16 instructions oneDNN's kernels use.
_BF16_INSTRUCTIONS = frozenset({"amx_bf16", "avx512_bf16"})


def cpu_flags() -> set[str] | None:
  """This CPU's feature flags (Linux's /proc/cpuinfo); None if unknown."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return None


def slower_here(name: str, *, accelerated: bool,
                flags: set[str] | None = None) -> str | None:
  """Why `train.precision=name` runs slower than float32 on this machine
  (a run on the CPU only: `accelerated` is False), or None.

  Measured on this project's CPUs (docs/pages/benchmarks.md): bfloat16 instructions make
  mixed_bfloat16 faster, AMX (flag amx_bf16) 1.6-1.9x, AVX-512 BF16 (flag
  avx512_bf16, an AMD EPYC without AMX) 1.3-1.5x; without either it is
  ~0.7x; float16 ~170x slower (no float16 arithmetic in the CPU kernels).
  """
  if accelerated or name == "float32":
    return None
  fix = "set --config.train.precision=float32"
  if name == "mixed_float16":
    return f"for GPUs: ~170x slower than float32 on a CPU; {fix}"
  flags = cpu_flags() if flags is None else flags
  if (name == "mixed_bfloat16" and flags is not None and
      not flags & _BF16_INSTRUCTIONS):
    return (f"~0.7x float32 on a CPU without bfloat16 instructions (this one"
            f" has neither amx_bf16 nor avx512_bf16; bfloat16 pays on TPUs"
            f" and CPUs with either); {fix}")
  return None


@contextlib.contextmanager
def policy(name: str):
  """Builds layers under `name`'s policy; restores the global one after."""
  before = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(PRECISIONS[name].policy)
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy(before)


def wrap(optimizer: keras.optimizers.Optimizer,
         name: str) -> keras.optimizers.Optimizer:
  """`optimizer`, under dynamic loss scaling if `name` is mixed_float16."""
  if PRECISIONS[name].loss_scaling:
    return keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


def loss_scaled(optimizer) -> bool:
  return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def inner(optimizer) -> keras.optimizers.Optimizer:
  """The optimizer that owns the slots (what checkpoints hold)."""
  return optimizer.inner_optimizer if loss_scaled(optimizer) else optimizer


def scale_loss(optimizer, loss: tf.Tensor) -> tf.Tensor:
  """The loss to differentiate: times the loss scale under mixed_float16."""
  return optimizer.scale_loss(loss) if loss_scaled(optimizer) else loss


def skip_unless_finite_everywhere(optimizer, grads):
  """Under loss scaling: all gradients NaN on every replica if any replica
  has a non-finite one, so the optimizer skips the step everywhere."""
  if not loss_scaled(optimizer):
    return grads
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
  bad = tf.distribute.get_replica_context().all_reduce(
      "SUM", tf.cast(tf.logical_not(finite), tf.float32))
  poison = tf.where(bad > 0, np.float32(np.nan), np.float32(1.0))
  return [g * tf.cast(poison, g.dtype) for g in grads]


def finite_everywhere(strategy: tf.distribute.Strategy, variables):
  """Whether `variables` (mirrored weights) hold no NaN or inf on any
  replica, in cross-replica context: each replica checks its own copy where
  it lives and one int is reduced (read on the host instead, every weight
  would cross from an accelerator)."""
  return strategy.reduce(
      "SUM", strategy.run(lambda: _bad([v.value for v in variables])),
      axis=None) == 0


def _bad(values):
  """1 if this replica's `values` (of the weights) hold a NaN or inf, else
  0."""
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                          for v in values])
  return tf.cast(tf.logical_not(finite), tf.int32)


def set_deterministic(on: bool) -> None:
  """`train.deterministic`: op determinism and no TensorFloat-32 (on), or
  TensorFlow's defaults (off). Process-wide; call before the run's first op.

  On a GPU many kernels sum in whatever order their threads finish (atomic
  adds), so two runs of one command differ in the last bits and drift
  apart; op determinism picks kernels that sum in a fixed order (an op
  without one raises UnimplementedError) and runs tf.data's stateful maps
  in order. TF32, on by default on Ampere and later GPUs, rounds a
  float32 matmul's or convolution's inputs to 10 mantissa bits; off, they
  keep float32's 23 (on a TPU too: its float32 matmuls get slower).

  Off undoes what an earlier deterministic run in this process (a
  notebook, a test) turned on, so the next run is not deterministic by
  accident (the trainer then times its input with tf.timestamp, which op
  determinism refuses); it leaves alone what the user set by hand.
  """
  global _turned_on
  if on:
    tf.config.experimental.enable_op_determinism()
    tf.config.experimental.enable_tensor_float_32_execution(False)
  elif _turned_on:
    compat.disable_op_determinism()  # no public API
    tf.config.experimental.enable_tensor_float_32_execution(True)
  _turned_on = on


_turned_on = False  # set_deterministic(True) ran last in this process
