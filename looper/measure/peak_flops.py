"""The machine's peak FLOP/s, which MFU (model FLOPs utilization) divides by.

Synopsis::

    machine = peak_flops.of_run(config.train, strategy)  # once per run
    machine.flops_per_sec           # all the run's devices
    machine.source                  # what it is, for the header
    machine.beaten(seen)            # a loop ran faster: raise it
    peak_flops.measure("bfloat16")  # the matmul probe alone

Where the figure comes from, first found:
1. `train.peak_flops`: of one GPU or TPU device (as TensorFlow lists
   them), or of one host's CPUs;
2. TABLE: the datasheet's dense peak of a known GPU or TPU (TPU: the
   TPU_ACCELERATOR_TYPE variable names it) in the run's compute dtype;
3. probes (`Probe`): the best speed of square matmuls of several sizes in
   the compute dtype (`measure`, ~1.6 s here), kept per device kind, cores,
   TensorFlow version and dtype in `cache_path()`. On a CPU there is no
   datasheet figure for what TensorFlow's kernels can reach (AMX,
   AVX-512, the cores TensorFlow may use): MFU is then of the measured
   matmul peak. One sweep is noise on a shared machine (2 AMD EPYC
   cores, float32: 178 GFLOP/s quiet; 82-120 in the seconds after, other
   work running; 87 under the test suite's load), so a probe is the best
   of ROUNDS sweeps GAP seconds apart, and the figure the best of up to
   PROBES records, a run adding a probe while there are fewer and the
   last is SPACING old (one busy hour does not set it for good).
The run's peak is that times its devices: its GPUs or TPU devices, or on
CPUs its machines (`machines`: a Mirrored split of one host's CPUs, or
workers started on one machine, share its cores).
The compute dtype is the precision's (mixed_bfloat16: bfloat16), as in
MaxText and PaLM's MFU: the float32 layers of a mixed model count at the
16-bit peak too.

MFU is never above 1: a loop faster than the peak raises it (`beaten`,
said once by looper.control.controller). A probed figure is measured again
(the first time in a run) and the best of that and the loop's speed is
what the cache then holds; a given one (flag, datasheet) becomes the
loop's speed.
"""

import dataclasses
import json
import os
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from looper.options import precision
from looper.workdir import formats

CHAIN = 4  # matmuls per timed call of the probe
ROUNDS, GAP = 3, 0.5  # a probe: the best of sweeps this many seconds apart
PROBES = 3  # records a probed figure is the best of (probes, loops)
SPACING = 3600.0  # seconds from a record to the next probe at a run's start

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
  return f"{name}, {_cores()} cores ({isa or 'no AVX'})"


def _cores() -> int:
  """The cores this process may use."""
  return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
          else os.cpu_count())


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
  return "CPU", _cpu_kind(), machines(strategy)


def machines(strategy) -> int:
  """The distinct machines the run's training tasks are on, by the host
  names of its cluster (loopback names are one machine); 1 outside
  multi-worker. Workers sharing a machine share its cores: each process's
  probe measures them all (unless pinned apart), and they count once."""
  resolver = getattr(strategy, "cluster_resolver", None)
  spec = resolver.cluster_spec().as_dict() if resolver else {}
  hosts = set()
  for job in ("chief", "worker"):
    tasks = spec.get(job, [])
    for address in tasks.values() if isinstance(tasks, dict) else tasks:
      host = address.rsplit(":", 1)[0].strip("[]").lower()
      loopback = host == "localhost" or host == "::1" or host.startswith(
          "127.")
      hosts.add("loopback" if loopback else host)
  return max(len(hosts), 1)


def datasheet(kind: str, dtype: str) -> float | None:
  """TABLE's peak of a device `kind` (its first match) in `dtype`."""
  for name, (half, tf32, single) in TABLE.items():
    if name in kind:
      if dtype != "float32":
        return half
      tf32_on = tf.config.experimental.tensor_float_32_execution_enabled()
      return tf32 if tf32 and tf32_on else single
  return None


def measure(dtype: str, *, rounds: int = ROUNDS, gap: float = GAP,
            per_size: float = 0.05, clock=time.perf_counter,
            sleep=time.sleep) -> float:
  """The best FLOP/s of `dtype` matmuls on the default device over
  `rounds` sweeps `gap` seconds apart (a busy second reads half: module
  doc). A sweep times calls of CHAIN square products, each size for
  `per_size` seconds, sizes doubling from 256 while a call takes under
  half of that (up to 8192).

  The best size is the machine's (measured: 2 busy Xeon cores, float32
  best at 512, bfloat16 at 1024; 2 AMD EPYC cores, float32 at 1024,
  per_size 0.05 s reading what 0.15 s did; a GPU's far larger). A sweep
  takes at most ~0.5 s (six sizes, the last call at most 8 times the one
  before, < per_size/2); here 0.2 s, the probe 1.6 s.
  """
  best = 0.0
  for i in range(rounds):
    if i:
      sleep(gap)
    best = max(best, _sweep(dtype, per_size, clock))
  return best


def _sweep(dtype: str, per_size: float, clock) -> float:
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


def cache_path(environ=None) -> str:
  """The probes' file: in $LOOPER_CACHE_DIR, else $XDG_CACHE_HOME/looper
  (an absolute one, as the XDG spec asks), else ~/.cache/looper."""
  environ = os.environ if environ is None else environ
  directory = environ.get("LOOPER_CACHE_DIR")
  if not directory:
    xdg = environ.get("XDG_CACHE_HOME", "")
    home = environ.get("HOME") or os.path.expanduser("~")
    directory = os.path.join(
        xdg if os.path.isabs(xdg) else os.path.join(home, ".cache"), "looper")
  return os.path.join(directory, "peak_flops.json")


def _read(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):  # none yet, or a torn write: measure again
    return {}


def _when(at: float) -> str:
  return (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at)) if at
          else "undated: an older looper's")


class Probe:
  """A device kind's matmul peak in `dtype`, kept under `key` in the JSON
  file `path`: records {flops_per_sec, at (Unix time), how: 'probe' or
  'loop'}, the PROBES best. Its figure is their best. `measure` (the
  probe) and `now` (the wall clock) are injectable: tests fake both.
  """

  def __init__(self, key: str, dtype: str, path: str, *,
               measure: Callable[[str], float] = measure,
               now: Callable[[], float] = time.time):
    self.key, self.dtype, self.path = key, dtype, path
    self._measure, self._now = measure, now
    self.records = self._load()

  @property
  def best(self) -> float:
    return max((r["flops_per_sec"] for r in self.records), default=0.0)

  def figure(self) -> float:
    """The best record, after a probe while there are fewer than PROBES
    records and the newest is SPACING old (or there is none)."""
    newest = max((r["at"] for r in self.records), default=None)
    if newest is None or (len(self.records) < PROBES and
                          self._now() - newest >= SPACING):
      self.add(probe=self.take())
    return self.best

  def take(self) -> float:
    """A probe's FLOP/s, now."""
    return self._measure(self.dtype)

  def add(self, **by_how: float) -> None:
    """Adds records ('probe' or 'loop' -> FLOP/s) to the file's as it is
    now (another run may have written since); keeps the PROBES best."""
    known = _read(self.path)
    self.records = sorted(self._load() + [
        dict(flops_per_sec=value, at=self._now(), how=how)
        for how, value in by_how.items()],
                          key=lambda r: -r["flops_per_sec"])[:PROBES]
    known[self.key] = self.records
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    tmp = f"{self.path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump(known, f, indent=1, sort_keys=True)
    os.replace(tmp, self.path)  # another run's write may be lost: no harm

  def describe(self) -> str:
    """'the best of 2 probes and 1 loop, a loop (2026-11-27 10:02 UTC);
    cached in PATH' (or 'a probe (...)'), for the header."""
    top = max(self.records, key=lambda r: r["flops_per_sec"])
    counts = [f"{n} {how}{'s' * (n > 1)}" for how in ("probe", "loop")
              if (n := sum(r["how"] == how for r in self.records))]
    best = (f"the best of {' and '.join(counts)}, "
            if len(self.records) > 1 else "")
    return (f"{best}a {top['how']} ({_when(top['at'])}); cached in"
            f" {self.path}")

  def _load(self) -> list[dict]:
    found = _read(self.path).get(self.key, [])
    if isinstance(found, (int, float)):  # an older looper's one probe
      return [dict(flops_per_sec=float(found), at=0.0, how="probe")]
    return found if isinstance(found, list) else []


@dataclasses.dataclass
class Peak:
  """What MFU divides by: `flops_per_sec`, of all the run's devices, is
  `per_device` (what `what` names) x `devices`."""
  per_device: float
  what: str  # e.g. "train.peak_flops=1e+11"
  devices: int = 1
  probe: Probe | None = None  # where a measured figure is kept
  measured_again: bool = False  # in this run, after a loop beat it

  @property
  def flops_per_sec(self) -> float:
    return self.per_device * self.devices

  @property
  def source(self) -> str:
    """What the figure is, for the header."""
    times = f" x {self.devices}" if self.devices > 1 else ""
    kept = f": {self.probe.describe()}" if self.probe else ""
    return f"{self.what}{times}{kept}"

  def beaten(self, seen: float) -> str:
    """A loop ran at `seen` FLOP/s (all devices), above the figure: raises
    it to at least that (module doc). What was done, for the one line
    that says so."""
    if self.probe is None:
      self.per_device = seen / self.devices
      if not self.what.startswith("a loop's speed"):
        self.what = f"a loop's speed, above {self.what}"
      return ("MFU is of the loop's speed from here on: the peak given is"
              " too low (or the FLOPs count too high); set"
              " --config.train.peak_flops to this machine's peak")
    again = {} if self.measured_again else dict(probe=self.probe.take())
    self.measured_again = True
    self.probe.add(**again, loop=seen / self.devices)
    self.per_device = self.probe.best
    taken = (f"measured it again"
             f" ({formats.flops(again['probe'] * self.devices)}); "
             if again else "")
    return (f"{taken}MFU is of {formats.flops(self.flops_per_sec)} from"
            f" here on: {self.probe.describe()}")


def of_run(train, strategy, path: str | None = None, *,
           measure: Callable[[str], float] = measure) -> Peak | None:
  """The run's peak (module doc), of the `train` block's precision and
  peak_flops, probes in `path` (cache_path()); None on a TPU of unknown
  kind without train.peak_flops."""
  dtype = compute_dtype(train.precision)
  device, kind, count = _devices(strategy)
  if train.peak_flops:
    return Peak(train.peak_flops, f"train.peak_flops={train.peak_flops:.4g}",
                count)
  # A CPU is never looked up: "Xeon E5-2690 v4" is no TPU v4.
  listed = datasheet(kind, dtype) if device != "CPU" else None
  if listed:
    return Peak(listed, f"the {kind}'s datasheet {dtype} peak", count)
  if device == "TPU":
    return None
  probe = Probe(f"{kind}, {dtype}, TensorFlow {tf.__version__}", dtype,
                path or cache_path(), measure=measure)
  where = f"this CPU's {_cores()} cores" if device == "CPU" else kind
  return Peak(probe.figure(), f"the measured {dtype} matmul peak of {where}",
              count, probe)
