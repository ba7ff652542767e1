"""Step time and optimizer state: sharded (distribution.shard_optimizer) vs
replicated, on CPU replicas.

Synopsis::

    python -m tests.bench.zero                  # 2 and 4 replicas, tiny
    python -m tests.bench.zero --replicas 2 --width 4096 --rounds 5
    python -m tests.bench.zero --model mlp      # where compute dominates
    python -m tests.bench.zero --memory         # 1, 2, 4: bytes and RSS

Per replica count (a process each), with Adam, one of two models: `tiny`,
the tiny experiment's 8-`width`-4 MLP (its parameters grow with `width`
only linearly: 26,628 at 2048, a step of about 1 ms, the update's fixed
costs dominate), or `mlp`, tests.bench.throughput's 784-512-512-10 MLP on
MNIST at batch 128 (669,706 parameters, where the forward and backward
pass dominate). Both trainers built, then `rounds` alternating rounds of
one K-step call each (after a first, traced call); prints the median ms
per step of each, their ratio (sharded / replicated, the median of the
rounds' ratios) and the optimizer state per device.

--memory: the tiny MLP on its 8 features as tokens embedded in `width`
(model.embed; 33.7 million parameters at 2048, mostly an 8 `width` x
`width` kernel, with small activations), Adam, replicated then sharded on
each replica count, a process each training two steps: the optimizer
state's bytes per parameter on the device holding most (from its
variables) and the process's peak resident memory (all its replicas:
logical CPUs share it; wait4's ru_maxrss).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from tests import bench
from tests.fixtures.paths import ROOT

K = 50


def _config(model: str, width: int):
  """The benchmarked experiment (module doc), with Adam, K steps a call."""
  from tests.bench import throughput  # pylint: disable=g-import-not-at-top
  from tests.fixtures import tiny  # pylint: disable=g-import-not-at-top
  from tests.fixtures.configs import configured  # pylint: disable=g-import-not-at-top
  if model == "mlp":
    config = throughput._config("mlp", "float32", *throughput._data())  # pylint: disable=protected-access
  else:
    config = configured(tiny.get_config(), model__width=width)
  return configured(config, optimizer__name="adam", train__steps=10_000,
                    train__steps_per_loop=K)


def measure(replicas: int, model: str, width: int, rounds: int) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from looper.options import optimizer_state  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  from tests.fixtures.configs import configured  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(distribute.split_cpu(replicas))
  trainers = {}
  for shard in (False, True):
    config = configured(_config(model, width),
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
              bytes=[optimizer_state.per_device(strategy, trainers[s].update)
                     for s in (False, True)])


def state(replicas: int, shard: bool, width: int) -> dict:
  """In this process: the optimizer state of two steps (--memory)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from looper.options import optimizer_state  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  from tests.fixtures.configs import configured  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(distribute.split_cpu(replicas))
  config = configured(_config("tiny", width), model__embed=width,
                      train__steps_per_loop=2,
                      distribution__shard_optimizer=shard)
  trainer = pieces.trainer(config, strategy)
  trainer.train(2)
  return dict(params=trainer.model.count_params(),
              bytes=optimizer_state.per_device(strategy, trainer.update))


def memory(replicas: list[str], width: int) -> None:
  """Each replica count, replicated then sharded: a process each (--memory)."""
  for n in replicas:
    row = []
    for shard in (False, True):
      proc = subprocess.Popen(
          ["timeout", "1800", sys.executable, "-m", "tests.bench.zero",
           "--state", n,
           str(shard), str(width)], cwd=ROOT, stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL, text=True)
      out = proc.stdout.read()
      # This child's peak (timeout's: its own, or its reaped child's).
      _, status, usage = os.wait4(proc.pid, 0)
      if status:
        raise RuntimeError(f"{n} replicas, shard_optimizer={shard}: {status}")
      r = json.loads(out.strip().splitlines()[-1])
      row.append(f"{r['bytes'] / r['params']:.1f} B/param/device, peak RSS"
                 f" {usage.ru_maxrss / 1024:,.0f} MB")
    print(f"{n} replicas, {r['params']:,} parameters, Adam: replicated"
          f" {row[0]}; sharded {row[1]}", flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--replicas", help="default 2,4; --memory: 1,2,4")
  parser.add_argument("--model", choices=("tiny", "mlp"), default="tiny")
  parser.add_argument("--width", type=int, default=2048, help="tiny's")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--memory", action="store_true")
  args = parser.parse_args(argv)
  bench.header()
  if args.memory:
    memory((args.replicas or "1,2,4").split(","), args.width)
    return 0
  for n in (args.replicas or "2,4").split(","):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench.zero", "--measure", n,
         args.model, str(args.width), str(args.rounds)], cwd=ROOT, capture_output=True,
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
  if sys.argv[1:2] == ["--state"]:
    print(json.dumps(state(int(sys.argv[2]), sys.argv[3] == "True",
                           int(sys.argv[4]))), flush=True)
    os._exit(0)  # pylint: disable=protected-access
  if sys.argv[1:2] == ["--measure"]:
    n, model, width, rounds = sys.argv[2:6]
    print(json.dumps(measure(int(n), model, int(width), int(rounds))),
          flush=True)
    os._exit(0)  # pylint: disable=protected-access
  sys.exit(main())
