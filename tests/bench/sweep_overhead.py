"""A sweep's wall time over the same trials run one after another by hand.

Synopsis::

    python -m tests.bench.sweep_overhead            # ~8 minutes, 2 cores
    python -m tests.bench.sweep_overhead --trials=8 --steps=200 --rounds=3

Each round runs `looper sweep` of experiments/mnist.py:bundled (`--trials`
trials of `--steps` steps, --parallel=1, random sampler, seed 0, no
pruning) and then a shell loop of `looper train_and_eval` with the very
values that sweep sampled (read from its trials' config.json), each in a
fresh folder; rounds alternate so both meet the machine in the same state.
Prints each wall time, their medians and the sweep's overhead in percent
(issue 48: within 5%).
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np

from tests import bench
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import LOOPBACK_ENV, looper_script

CONFIG = "--config=experiments/mnist.py:bundled"


def _timed(command: str, env: dict) -> float:
  start = time.monotonic()
  subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, check=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return time.monotonic() - start


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--trials", type=int, default=8)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--rounds", type=int, default=2)
  a = parser.parse_args()
  env = dict(os.environ, **LOOPBACK_ENV)
  looper = looper_script()
  common = f"{CONFIG} --config.train.steps={a.steps}"
  sweeps, loops = [], []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(a.rounds):
      sweep_dir = f"{tmp}/sweep{r}"
      sweeps.append(_timed(
          f"{looper} sweep {common} --workdir={sweep_dir} --trials={a.trials}"
          " --sampler=random --seed=0 --pruner=none", env))
      lines = []
      for n in range(a.trials):
        config = json.load(open(f"{sweep_dir}/trials/{n}/config.json"))
        lines.append(
            f"{looper} train_and_eval {common} --workdir={tmp}/loop{r}/{n}"
            f" --config.optimizer.learning_rate="
            f"{config['optimizer']['learning_rate']!r}"
            f" --config.model.width={config['model']['width']}")
      loops.append(_timed(" && ".join(lines), env))
      print(f"round {r}: sweep {sweeps[-1]:.1f} s, loop {loops[-1]:.1f} s",
            flush=True)
  s, l = np.median(sweeps), np.median(loops)
  print(bench.machine())
  print(f"{a.trials} trials of {a.steps} MNIST steps, {a.rounds} round(s):"
        f" sweep {s:.1f} s, shell loop {l:.1f} s: overhead"
        f" {100 * (s / l - 1):+.1f}%")


if __name__ == "__main__":
  main()
