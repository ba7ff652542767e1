"""Bytes/s of sampling the LM: its key/value cache vs the whole window.

Synopsis::

    python -m tests.bench.lm_sample                  # contexts 64 and 256
    python -m tests.bench.lm_sample --contexts=64 --bytes=400 --rounds=5

A random model of experiments/lm.py's defaults at each context (4 blocks
of width 128, 4 heads; the speed does not depend on the weights) samples
--bytes bytes after a one-byte prompt (top_k=20), in alternating rounds
of four ways (`sample.generate`):
  eager       the sampler before the cache: the Keras model called
              eagerly on the whole window for each byte, the window sliding
              by one byte (keep=context);
  window      the whole window per byte through one traced function (as
              an export serves it), keep=context;
  window/2    the same with keep=context // 2: the cached path's windows;
  cached      the key/value cache (`model.Decoder`), keep=context // 2
              (generate's default): the bytes of window/2.
Reports the median bytes/s over --rounds, after a first call of each (the
traces).
"""

import argparse
import time

from tests import bench


def measure(context: int, num_bytes: int, rounds: int) -> dict:
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from experiments import lm  # pylint: disable=g-import-not-at-top
  from experiments.text import sample  # pylint: disable=g-import-not-at-top

  c = lm.get_config()
  c.model.context = context
  keras.utils.set_random_seed(0)
  model = lm.model_fn(c)
  traced = tf.function(lambda x: model(x, training=False))
  half = max(1, context // 2)
  ways = {"eager": (model.__call__, context), "window": (traced, context),
          "window/2": (traced, half), "cached": (model, half)}

  def run(name, n):
    logits_fn, keep = ways[name]
    return sample.generate(logits_fn, b"T", n, context=context, top_k=20,
                           seed=1, keep=keep)

  assert run("cached", num_bytes) == run("window/2", num_bytes)
  for name in ways:
    run(name, 2)  # the traces
  speeds = {name: [] for name in ways}
  for _ in range(rounds):
    for name in ways:
      start = time.perf_counter()
      run(name, num_bytes)
      speeds[name].append(num_bytes / (time.perf_counter() - start))
  return {name: float(np.median(s)) for name, s in speeds.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--contexts", default="64,256")
  parser.add_argument("--bytes", type=int, default=300)
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  bench.header()
  print("| context | eager | window | window/2 | cached | cached/eager |\n"
        "|---|---|---|---|---|---|", flush=True)
  for context in map(int, args.contexts.split(",")):
    r = measure(context, args.bytes, args.rounds)
    print(f"| {context} | " + " | ".join(f"{v:.0f}" for v in r.values()) +
          f" | {r['cached'] / r['eager']:.1f}x |", flush=True)


if __name__ == "__main__":
  main()
