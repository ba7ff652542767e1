"""A whole run's steps/s (the loops and every action between them): this tree vs another checkout.

Synopsis::

    python -m tests.bench.run_overhead --against=/work/main   # ~3 minutes
    python -m tests.bench.run_overhead --against=/work/main --rounds=7 \\
        --steps_per_loop=10 --fields=config.trackers=mlflow

Trains tests/fixtures/tiny.py (array mode: the smallest step, so the
host's work between loops weighs most) for `--steps` steps of
`--steps_per_loop`, no evaluation, a save at the end, in `--mode=train`
processes that alternate between this tree and `--against` (each process
imports looper from its tree), `--rounds` each. A run's speed is its steps
over the time from its first train line to its last in metrics.jsonl
(loops and actions; not the start-up, the first loop's trace or the final
save). Reports each tree's median and their ratio (this / against).
`--fields` adds overrides to this tree's runs only (what a feature costs).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from tests import bench
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import LOOPBACK_ENV


def steps_per_sec(tree: str, workdir: str, steps: int, steps_per_loop: int,
                  fields: list[str]) -> float:
  """One run in `tree`'s looper; its steps/s between its first and last
  train lines."""
  from looper.workdir import jsonl  # pylint: disable=g-import-not-at-top
  args = ["--config=tests/fixtures/tiny.py", f"--workdir={workdir}",
          "--mode=train", f"--config.train.steps={steps}",
          f"--config.train.steps_per_loop={steps_per_loop}",
          "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0",
          "--config.data.as_arrays=True", *fields]
  env = dict(os.environ, PYTHONPATH=tree, **LOOPBACK_ENV)
  subprocess.run([sys.executable, "-m", "looper.main", *args], cwd=tree,
                 env=env, check=True, capture_output=True, timeout=1800)
  lines = [l for l in jsonl.read(os.path.join(workdir, "metrics.jsonl"))
           if l["kind"] == "train"]
  first, last = lines[0], lines[-1]
  return (last["step"] - first["step"]) / (last["time"] - first["time"])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--against", required=True,
                      help="another checkout of looper (e.g. main's)")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=20_000)
  parser.add_argument("--steps_per_loop", type=int, default=10)
  parser.add_argument("--fields", nargs="*", default=[],
                      help="--config.X=Y overrides for this tree's runs")
  flags = parser.parse_args()
  fields = [f if f.startswith("--") else f"--{f}" for f in flags.fields]
  bench.header()
  speeds = {"this": [], "against": []}
  with tempfile.TemporaryDirectory() as scratch:
    for i in range(flags.rounds):
      order = [("this", str(ROOT)), ("against", flags.against)]
      for name, tree in order if i % 2 == 0 else order[::-1]:
        workdir = os.path.join(scratch, f"{name}-{i}")
        speeds[name].append(steps_per_sec(
            tree, workdir, flags.steps, flags.steps_per_loop,
            fields if name == "this" else []))
        print(f"round {i} {name}: {speeds[name][-1]:.0f} steps/s",
              flush=True)
  this, against = (float(np.median(speeds[n])) for n in ("this", "against"))
  ratios = [a / b for a, b in zip(speeds["this"], speeds["against"])]
  print(f"median steps/s: this {this:.0f}, against {against:.0f}; ratio"
        f" {this / against:.4f} (per round, median {np.median(ratios):.4f},"
        f" {min(ratios):.4f}-{max(ratios):.4f})")


if __name__ == "__main__":
  main()
