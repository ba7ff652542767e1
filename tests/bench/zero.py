"""Step time and optimizer state: sharded (distribution.shard_optimizer) vs
replicated, on CPU replicas.

Synopsis::

    python -m tests.bench.zero                  # 2 and 4 replicas
    python -m tests.bench.zero --replicas 2 --width 4096 --rounds 5

Per replica count (a process each), the tiny experiment's MLP at `width`
with Adam: both trainers built, then `rounds` alternating rounds of one
K-step call each (after a first, traced call); prints the median ms per
step of each, their ratio (sharded / replicated, the median of the
rounds' ratios) and the optimizer state per device.
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from tests.fixtures.paths import ROOT

K = 50


def measure(replicas: int, width: int, rounds: int) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from looper.options import sharding  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  from tests.fixtures import tiny  # pylint: disable=g-import-not-at-top
  from tests.fixtures.configs import configured  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(distribute.split_cpu(replicas))
  trainers = {}
  for shard in (False, True):
    config = configured(tiny.get_config(), optimizer__name="adam",
                        model__width=width, train__steps=10_000,
                        train__steps_per_loop=K,
                        distribution__shard_optimizer=shard)
    trainers[shard] = pieces.trainer(config, strategy)
    trainers[shard].train(K)  # traced
  times = {False: [], True: []}
  for _ in range(rounds):
    for shard, t in trainers.items():
      start = time.perf_counter()
      t.train(K)
      times[shard].append((time.perf_counter() - start) / K * 1000)
  ratios = [s / r for s, r in zip(times[True], times[False])]
  return dict(ms=[float(np.median(times[s])) for s in (False, True)],
              ratio=float(np.median(ratios)),
              params=trainers[False].model.count_params(),
              bytes=[sharding.per_device(strategy, trainers[s].update)
                     for s in (False, True)])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--replicas", default="2,4")
  parser.add_argument("--width", type=int, default=2048)
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args(argv)
  for n in args.replicas.split(","):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench.zero", "--measure", n,
         str(args.width), str(args.rounds)], cwd=ROOT, capture_output=True,
        text=True, timeout=1800, check=False)
    if proc.returncode != 0:
      print(f"{n} replicas failed:\n{proc.stderr[-3000:]}")
      return 1
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{n} replicas, {r['params']:,} parameters: {r['ms'][0]:.2f} ms/step"
          f" replicated, {r['ms'][1]:.2f} sharded ({r['ratio']:.2f}x);"
          f" optimizer state per device {r['bytes'][0]:,} B ->"
          f" {r['bytes'][1]:,} B", flush=True)
  return 0


if __name__ == "__main__":
  if sys.argv[1:2] == ["--measure"]:
    import os  # pylint: disable=g-import-not-at-top
    print(json.dumps(measure(*map(int, sys.argv[2:5]))), flush=True)
    os._exit(0)  # pylint: disable=protected-access
  sys.exit(main())
