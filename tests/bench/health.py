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

2026-11-27, AMD EPYC (2 cores, no AMX), on/off: MLP 0.986 on 1 replica (12
rounds), 0.980 on 2 (12; 9dba010, each replica squaring the whole summed
gradient: 0.924 in the same hour, 0.954 before), CNN 0.995 on 1 (12), 0.993
on 2 (4). The norm's kernels: ~35-45 us per update for the MLP's 669k
gradients on both cores (l2_loss; a matmul, a reduce_sum of squares or XLA
no faster), 1.5-2% of its 6.6 ms step; in one process, alternating, a
constant in the norm's place cost nothing on 1 replica. A whole run of
tests/fixtures/tiny.py (0.7 ms steps, 10-step loops: python -m
tests.bench.run_overhead --against=. --fields=config.train.health_metrics=
False) pays 7%: on/off 0.932 (0.925-0.954); its train calls alone (0.26 ms
steps) 0.915-0.924 as before the split, 0.910 in 100-step calls: ~18 us
of small ops per update (~12: a kernel per gradient, the buffer's write),
not the loop's start and end.
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
  bench.header()
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
