"""Benchmarks: commands outside the suite, their last results in BUILD.md.

`steady` is the one reading of a benchmark run's speed the benchmarks share.
"""

import numpy as np

from tests.conftest import scalars


def steady(train_dir: str) -> dict[str, float]:
  """Medians of a run's examples/s and input-wait fraction over its train
  loops but the first (tracing and compiling)."""
  speeds = scalars(train_dir, "examples_per_sec")
  waits = scalars(train_dir, "input_wait_fraction")
  kept = sorted(speeds)[1:]
  return dict(examples_per_sec=float(np.median([speeds[s] for s in kept])),
              input_wait=float(np.median([waits[s] for s in kept])))
