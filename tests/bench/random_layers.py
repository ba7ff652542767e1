"""What replica-invariant Keras random layers cost: steps/s with and without.

Synopsis::

    python -m tests.bench.random_layers             # 1 and 2 replicas
    python -m tests.bench.random_layers --replicas=2 --rounds=20

The model is the one a Keras user ports from `fit` (Conv2D 32, MaxPooling,
Conv2D 64, MaxPooling, Dropout(0.2), Dense 128, Dropout(0.5), Dense 10) on
random 28x28x1 images, global batch 128, 20 steps per train call. Each
(replicas, layers) configuration runs in its own process:
  adopted   Keras' Dropout as looper runs it (looper.train.randomness:
            tiled to the global batch on each replica);
  keras     Keras' Dropout as Keras runs it (the table emptied: the same
            draws on every replica, not replica-invariant);
  looper    looper.train.layers.Dropout (draws the global batch's noise).
Prints steps/s, the median over --rounds calls after the first.
"""

import argparse
import json
import time

from tests import bench

STEPS = 20  # per train call


def measure(replicas: int, layers: str, rounds: int) -> dict:
  """One configuration, in this (fresh) process."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper import config as lc  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from looper.train import layers as looper_layers  # pylint: disable=g-import-not-at-top
  from looper.train import randomness  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top

  strategy = (tf.distribute.MirroredStrategy(distribute.split_cpu(replicas))
              if replicas > 1 else tf.distribute.get_strategy())
  if layers == "keras":
    randomness.PER_EXAMPLE = ()
  dropout = looper_layers.Dropout if layers == "looper" else (
      keras.layers.Dropout)
  L = keras.layers  # pylint: disable=invalid-name

  def model_fn(config):  # pylint: disable=unused-argument
    return keras.Sequential([
        keras.Input((28, 28, 1)), L.Conv2D(32, 3, activation="relu"),
        L.MaxPooling2D(), L.Conv2D(64, 3, activation="relu"),
        L.MaxPooling2D(), L.Flatten(), dropout(0.2),
        L.Dense(128, activation="relu"), dropout(0.5), L.Dense(10)])

  rng = np.random.default_rng(0)
  x = rng.random((1024, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, 10, 1024).astype(np.int32)
  c = lc.default_config()
  c.model_fn = model_fn
  c.dataset_fn = lambda config, split: (x, y)
  c.train.steps, c.train.batch_size, c.train.steps_per_loop = 1000, 128, STEPS
  trainer = pieces.trainer(c, strategy)
  trainer.train(STEPS)  # the trace
  seconds = []
  for _ in range(rounds):
    start = time.perf_counter()
    trainer.train(STEPS)
    seconds.append(time.perf_counter() - start)
  return {"steps_per_sec": STEPS / float(np.median(seconds))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--replicas", default="1,2")
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--one", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.one:  # a child: one configuration
    replicas, layers = args.one.split(":")
    print(json.dumps(measure(int(replicas), layers, args.rounds)))
    return
  bench.header()
  for replicas in args.replicas.split(","):
    for layers in ("adopted", "keras", "looper"):
      out = bench.child("tests.bench.random_layers",
                        f"--one={replicas}:{layers}",
                        f"--rounds={args.rounds}")
      if out:
        print(f"{replicas} replica(s), {layers:8s}"
              f" {out['steps_per_sec']:.1f} steps/s", flush=True)


if __name__ == "__main__":
  main()
