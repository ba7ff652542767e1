"""The machine's peak FLOP/s, which MFU (model FLOPs utilization) divides by.

Synopsis::

    machine = peak_flops.of_run(config, strategy)  # once per run (looper.run)
    machine.flops_per_sec                    # all the run's devices
    machine.source                           # what it is, for the header
    peak_flops.measure("bfloat16")                 # the matmul probe alone

Where the figure comes from, first found:
1. `train.peak_flops`: of one GPU or TPU device (as TensorFlow lists
   them), or of one host's CPUs;
2. TABLE: the datasheet's dense peak of a known GPU or TPU (TPU: the
   TPU_ACCELERATOR_TYPE variable names it) in the run's compute dtype;
3. a probe: the best speed of square matmuls of several sizes in the
   compute dtype (`measure`, ~1 s), cached per device kind, cores,
   TensorFlow version and dtype in CACHE (delete it to measure again).
   On a CPU there is no datasheet figure for what TensorFlow's kernels
   can reach (AMX, AVX-512, the cores TensorFlow may use): MFU is then
   "against the measured matmul peak", which a busy machine under-measures
   (a loop above it is said once: looper.train.controller).
The run's peak is that times its devices: its GPUs or TPU devices, or on
CPUs its hosts (a Mirrored split of one host's CPUs shares their cores).
The compute dtype is the precision's (mixed_bfloat16: bfloat16), as in
MaxText and PaLM's MFU: the float32 layers of a mixed model count at the
16-bit peak too.
"""

import dataclasses
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

from looper.train import flops
from looper.options import precision

CACHE = "~/.cache/looper/peak_flops.json"
CHAIN = 4  # matmuls per timed call of the probe

# Dense (no sparsity) peak FLOP/s per device: (16-bit: bfloat16, or float16
# where there is no bfloat16; float32 via TF32, which TensorFlow uses on
# Ampere and later unless train.deterministic; float32). First match of the
# device name wins. Sources, fetched 2026-11: NVIDIA's datasheets (A100
# 40/80GB; H100 SXM and PCIe; L4; L40S; A10; V100; T4); Google Cloud's TPU
# system architecture pages (cloud.google.com/tpu/docs/v2 ... /v6e: per
# chip; v2 and v3 show TensorFlow 2 devices (cores) per chip, halved here;
# a TPU's float32 matmul runs as bfloat16 passes on its MXUs).
TABLE = {
    "H100 PCIe": (756e12, 378e12, 51e12),
    "H100": (989e12, 495e12, 67e12),
    "A100": (312e12, 156e12, 19.5e12),
    "L40S": (362e12, 183e12, 91.6e12),
    "L4": (121e12, 60e12, 30.3e12),
    "A10": (125e12, 62.5e12, 31.2e12),
    "V100": (125e12, None, 15.7e12),
    "T4": (65e12, None, 8.1e12),
    "v6e": (918e12,) * 3,
    "v5p": (459e12,) * 3,
    "v5litepod": (197e12,) * 3, "v5e": (197e12,) * 3,
    "v4": (275e12,) * 3,
    "v3": (61.5e12,) * 3,
    "v2": (22.5e12,) * 3,
}


@dataclasses.dataclass(frozen=True)
class Peak:
  flops_per_sec: float  # of all the run's devices
  source: str  # e.g. "the bfloat16 matmul speed measured on this CPU ..."


def compute_dtype(precision_name: str) -> str:
  """The dtype a `train.precision`'s layers compute in."""
  policy = precision.PRECISIONS[precision_name].policy
  return keras.mixed_precision.Policy(policy).compute_dtype


def _cpu_kind() -> str:
  """This CPU's model name, the cores this process may use and its matmul
  instruction sets: what the probe's speed depends on."""
  name = "CPU"
  try:
    with open("/proc/cpuinfo") as f:
      name = next((l.split(":", 1)[1].strip() for l in f
                   if l.startswith("model name")), name)
  except OSError:
    pass
  flags = precision.cpu_flags() or set()
  isa = "+".join(sorted(flags & {"amx_bf16", "avx512_bf16", "avx512f",
                                 "avx2"}))
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count())
  return f"{name}, {cores} cores ({isa or 'no AVX'})"


def _devices(strategy) -> tuple[str, str, int]:
  """(device type, kind, how many) of the run's devices."""
  gpus = tf.config.list_logical_devices("GPU")
  if isinstance(strategy, tf.distribute.TPUStrategy):
    kind = os.environ.get("TPU_ACCELERATOR_TYPE", "TPU").split("-")[0]
    return "TPU", kind, strategy.num_replicas_in_sync
  if gpus:
    details = tf.config.experimental.get_device_details(
        tf.config.list_physical_devices("GPU")[0])
    return "GPU", details.get("device_name", "GPU"), (
        strategy.num_replicas_in_sync)
  hosts = strategy.num_replicas_in_sync // flops.graph_replicas(strategy)
  return "CPU", _cpu_kind(), hosts


def datasheet(kind: str, dtype: str) -> float | None:
  """TABLE's peak of a device `kind` (its first match) in `dtype`."""
  for name, (half, tf32, single) in TABLE.items():
    if name in kind:
      if dtype != "float32":
        return half
      tf32_on = tf.config.experimental.tensor_float_32_execution_enabled()
      return tf32 if tf32 and tf32_on else single
  return None


def measure(dtype: str, *, per_size: float = 0.15,
            clock=time.perf_counter) -> float:
  """The best FLOP/s of `dtype` matmuls on the default device: calls of
  CHAIN square products, each size timed for `per_size` seconds, sizes
  doubling from 256 while a call takes under half of that (up to 8192).

  The best size is the machine's (measured, 2 busy Xeon cores: float32
  best at 512, bfloat16 at 1024; a GPU's far larger). At most ~1.5 s: six
  sizes, and the last call at most 8 times the one before (< per_size/2).
  """
  rng = np.random.default_rng(0)
  n, best = 256, 0.0
  while True:
    # Entries of variance 1/n: a product keeps the scale (no overflow, no
    # slow subnormals).
    a = tf.cast(rng.standard_normal((n, n), np.float32) / np.sqrt(n), dtype)
    _ = tf.matmul(a, a)[0, 0].numpy()  # kernel set-up, off the clock
    start = clock()
    while True:
      begin = clock()
      x = a
      for _ in range(CHAIN):
        x = tf.matmul(x, a)
      _ = x[0, 0].numpy()  # waits for an accelerator too
      took = max(clock() - begin, 1e-9)
      best = max(best, CHAIN * 2 * n ** 3 / took)
      if clock() - start >= per_size:
        break
    if took >= per_size / 2 or n >= 8192:
      return best
    n *= 2


def _read(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):  # none yet, or a torn write: measure again
    return {}


def cached_probe(key: str, dtype: str, path: str = CACHE) -> float:
  """`measure(dtype)`, once per `key` (device kind and dtype) on this
  machine: kept in the JSON file `path`."""
  path = os.path.expanduser(path)
  known = _read(path)
  if key not in known:
    known[key] = measure(dtype)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump(known, f, indent=1, sort_keys=True)
    os.replace(tmp, path)  # another run's write may be lost: it re-measures
  return known[key]


def of_run(config, strategy, path: str = CACHE) -> Peak | None:
  """The run's peak (module doc); None on a TPU of unknown kind without
  train.peak_flops."""
  dtype = compute_dtype(config.train.precision)
  device, kind, count = _devices(strategy)
  times = f" x {count}" if count > 1 else ""
  if config.train.peak_flops:
    return Peak(config.train.peak_flops * count,
                f"train.peak_flops={config.train.peak_flops:.4g}{times}")
  # A CPU is never looked up: "Xeon E5-2690 v4" is no TPU v4.
  listed = datasheet(kind, dtype) if device != "CPU" else None
  if listed:
    return Peak(listed * count, f"the {kind}'s datasheet {dtype} peak{times}")
  if device == "TPU":
    return None
  key = f"{kind}, {dtype}, TensorFlow {tf.__version__}"
  probed = cached_probe(key, dtype, path)
  return Peak(probed * count,
              f"the {dtype} matmul speed measured on this {device}{times}"
              f" (cached in {path})")
