"""What the health figures cost (train.health_metrics, train.grad_norm): steps/s on vs off.

Synopsis::

    python -m tests.bench.health                 # MLP and CNN, 1 and 2 replicas
    python -m tests.bench.health --figures=all   # the gradient's norm too
    python -m tests.bench.health --models=mlp --replicas=1 --rounds=40

`--figures=default` times the figures a run has by default (the weights'
norm and the update ratio, per loop) against none; `--figures=all` adds
the gradient's norm (train.grad_norm, per update).

The throughput benchmark's models, data and K=50 steps per call
(tests/bench/throughput.py: the 784-512-512-10 MLP, the MNIST CNN at width
32, array mode) with Adam, looper's defaults, at batch 256 (the issue 47
protocol; `--batch`). Each configuration runs in fresh processes: one
Trainer with the health figures, one without, in alternating rounds of
`--calls` calls each (8 rounds by default); the paired ratio (on / off,
per round) is the median over the rounds. The Trainer built first in a
process ran 1-3% slower here whichever it was, so each configuration runs
twice, once in each build order, and the figure is the geometric mean of
the two ratios (also of the two ratios of each Trainer's best round: a
round another process slowed drops out). The MLP is the worst case: the most parameters per FLOP
(the gradient norm reads every gradient once more).

What the figures cost since issue 47 (looper.measure.health): per update
the norm's kernels (l2_loss over the replica's 1/N of each summed
gradient: ~35-45 us for the MLP's 669k gradients on both cores, where a
matmul, a reduce_sum of squares or XLA were no faster) and ~4 scalar ops,
its square a column of the loop's per-step buffer beside the loss (before:
its own buffer, update counter and scatter, ~12 small ops); per loop a
copy of the weights and three norms. Results: BUILD.md "Benchmarks".
"""

import argparse
import json
import time

from tests import bench
from tests.bench import throughput


def measure(model: str, replicas: int, rounds: int, calls: int,
            off_first: bool, figures: str) -> dict:
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
    c.train.grad_norm = on and figures == "all"
    trainers[on] = pieces.trainer(c, strategy)
    trainers[on].train(throughput.K)
  speeds = {True: [], False: []}
  for _ in range(rounds):
    for on, trainer in trainers.items():
      start = time.perf_counter()
      for _ in range(calls):
        trainer.train(throughput.K)
      speeds[on].append(calls * throughput.K / (time.perf_counter() - start))
  return dict(steps_per_sec={"on": float(np.median(speeds[True])),
                             "off": float(np.median(speeds[False]))},
              ratio=float(np.median(np.array(speeds[True]) /
                                    np.array(speeds[False]))),
              best=max(speeds[True]) / max(speeds[False]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="mlp,cnn")
  parser.add_argument("--replicas", default="1,2")
  parser.add_argument("--rounds", type=int, default=8)
  parser.add_argument("--calls", type=int, default=3,
                      help="K-step calls of each Trainer per round")
  parser.add_argument("--batch", type=int, default=256,
                      help="the global batch")
  parser.add_argument("--figures", choices=("default", "all"),
                      default="default")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # child processes
  args = parser.parse_args()
  throughput.BATCH = args.batch
  if args.one:
    model, replicas, order = args.one.split(",")
    print(json.dumps(measure(model, int(replicas), args.rounds, args.calls,
                             off_first=order == "off", figures=args.figures)))
    return
  print(bench.machine())
  for model in args.models.split(","):
    for replicas in args.replicas.split(","):
      runs = [bench.child("tests.bench.health",
                          f"--one={model},{replicas},{order}",
                          f"--rounds={args.rounds}", f"--calls={args.calls}",
                          f"--batch={args.batch}",
                          f"--figures={args.figures}")
              for order in ("off", "on")]
      if None in runs:
        continue
      mean = {k: (runs[0][k] * runs[1][k]) ** 0.5 for k in ("ratio", "best")}
      print(f"{model}, {replicas} replica(s), batch {args.batch},"
            f" {args.figures} figures: on/off"
            f" {mean['ratio']:.3f} (built off first {runs[0]['ratio']:.3f},"
            f" on first {runs[1]['ratio']:.3f}), best rounds'"
            f" {mean['best']:.3f}; steps/s off"
            f" {runs[0]['steps_per_sec']['off']:.1f}, on"
            f" {runs[0]['steps_per_sec']['on']:.1f}", flush=True)


if __name__ == "__main__":
  main()
