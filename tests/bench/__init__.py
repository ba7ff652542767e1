"""Benchmarks: commands outside the suite, their last results in BUILD.md.

`steady` is the one reading of a benchmark run's speed the benchmarks share,
`machine` the line naming the CPU every printed figure needs, `child` a
benchmark's measurement in a fresh process.
"""

import json
import os
import subprocess
import sys

import numpy as np

from tests.fixtures.events import scalars
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import LOOPBACK_ENV


def steady(train_dir: str) -> dict[str, float]:
  """Medians of a run's examples/s and input-wait fraction over its train
  loops but the first (tracing and compiling)."""
  speeds = scalars(train_dir, "examples_per_sec")
  waits = scalars(train_dir, "input_wait_fraction")
  kept = sorted(speeds)[1:]
  return dict(examples_per_sec=float(np.median([speeds[s] for s in kept])),
              input_wait=float(np.median([waits[s] for s in kept])))


def machine() -> str:
  """'N CPUs: <model name>' from /proc/cpuinfo (figures name their CPU)."""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((l.split(":", 1)[1].strip() for l in f
                    if l.startswith("model name")), "unknown")
  except OSError:
    model = "unknown"
  return f"{os.cpu_count()} CPUs: {model}"


def child(module: str, *flags: str) -> dict | None:
  """Runs `python -m module flags` in a fresh process (its own TensorFlow);
  the JSON object its last stdout line holds, or None (said) if it failed."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  proc = subprocess.run(
      [sys.executable, "-m", module, *flags], cwd=ROOT, env=env,
      timeout=3600, capture_output=True, text=True, check=False)
  if proc.returncode:
    print(f"{' '.join(flags)}: failed\n{proc.stderr[-1500:]}", flush=True)
    return None
  return json.loads(proc.stdout.strip().splitlines()[-1])
