"""What the health figures cost (train.health_metrics): steps/s on vs off.

Synopsis::

    python -m tests.bench.health                     # MLP and CNN, 1 and 2 replicas
    python -m tests.bench.health --models=mlp --replicas=1 --rounds=60

The throughput benchmark's models, data, batch and K steps per call
(tests/bench/throughput.py: the 784-512-512-10 MLP, the MNIST CNN at width
32, batch 128, K=50, array mode) with Adam, looper's defaults. Each
configuration runs in fresh processes: one Trainer with the health
figures, one without, in alternating rounds of 3 calls; the paired ratio
(on / off, per round) is the median over the rounds. The Trainer built
first in a process ran 1-3% slower here whichever it was, so each
configuration runs twice, once in each build order, and the figure is the
geometric mean of the two ratios. The MLP is the worst case: the most
parameters per FLOP (the gradient norm reads every gradient once more).

2026-11-27, AMD EPYC (2 cores, no AMX), on/off: MLP 0.977 on 1 replica (20
rounds), 0.954 on 2 (12), CNN 1.002 on 1 (8). On 2 replicas (logical CPUs
sharing the 2 cores) any read of the summed gradient costs ~5%: the norm
of half the gradients on each replica, or of all on replica 0 only, cost
the same, a constant in the norm's place nothing (measured in one process,
alternating). A whole run of tests/fixtures/tiny.py (0.7 ms steps, 10-step
loops: python -m tests.bench.run_overhead) pays ~14 small ops per update:
on 0.939 (0.918-1.007), off 0.984 (0.930-1.054) against 7552624.
"""

import argparse
import json
import time

from tests import bench
from tests.bench import throughput


def measure(model: str, replicas: int, rounds: int, off_first: bool) -> dict:
  """The on/off ratio of one configuration, in this (fresh) process."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  strategy = (tf.distribute.MirroredStrategy(distribute.split_cpu(replicas))
              if replicas > 1 else tf.distribute.get_strategy())
  images, labels = throughput._data()  # pylint: disable=protected-access
  config = throughput._config(model, "float32", images, labels)  # pylint: disable=protected-access
  trainers = {}
  for on in ((False, True) if off_first else (True, False)):
    c = config.copy_and_resolve_references()
    c.train.health_metrics = on
    trainers[on] = pieces.trainer(c, strategy)
    trainers[on].train(throughput.K)
  speeds = {True: [], False: []}
  for _ in range(rounds):
    for on, trainer in trainers.items():
      start = time.perf_counter()
      for _ in range(3):
        trainer.train(throughput.K)
      speeds[on].append(3 * throughput.K / (time.perf_counter() - start))
  return dict(steps_per_sec={"on": float(np.median(speeds[True])),
                             "off": float(np.median(speeds[False]))},
              ratio=float(np.median(np.array(speeds[True]) /
                                    np.array(speeds[False]))))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="mlp,cnn")
  parser.add_argument("--replicas", default="1,2")
  parser.add_argument("--rounds", type=int, default=40)
  parser.add_argument("--one", help=argparse.SUPPRESS)  # child processes
  args = parser.parse_args()
  if args.one:
    model, replicas, order = args.one.split(",")
    print(json.dumps(measure(model, int(replicas), args.rounds,
                             off_first=order == "off")))
    return
  print(bench.machine())
  for model in args.models.split(","):
    for replicas in args.replicas.split(","):
      runs = [bench.child("tests.bench.health",
                          f"--one={model},{replicas},{order}",
                          f"--rounds={args.rounds}")
              for order in ("off", "on")]
      if None in runs:
        continue
      mean = (runs[0]["ratio"] * runs[1]["ratio"]) ** 0.5
      print(f"{model}, {replicas} replica(s): on/off {mean:.3f} (built off"
            f" first {runs[0]['ratio']:.3f}, on first {runs[1]['ratio']:.3f});"
            f" steps/s off {runs[0]['steps_per_sec']['off']:.1f}, on"
            f" {runs[0]['steps_per_sec']['on']:.1f}", flush=True)


if __name__ == "__main__":
  main()
