"""Memory and step time of the LM's train step with and without model.remat.

Synopsis::

    python -m tests.bench.lm_remat                   # contexts 256, 1024
    python -m tests.bench.lm_remat --contexts=256 --batch=16 --jit

Each (context, remat) configuration runs in its own process (peak memory
is per process): looper's Trainer on experiments/lm.py's model (its
defaults: 4 blocks of width 128, 4 heads; AdamW, clipping) over random
bytes in array mode, --batch windows per step, K steps per train call.
Reports, per configuration:
  tf peak  TensorFlow's peak allocated bytes on CPU:0 over the timed calls
           (its allocator's own count, reset after the first call; a BFC
           allocator on every CPU: processes.MEMORY_STATS_ENV): the
           tensors a step holds at once, the activations kept for the
           backward pass among them;
  rss      the process' peak resident memory (ru_maxrss: with TensorFlow,
           Python, the traced graphs and the data);
  s/step   the median over --rounds calls after the first (the trace).
With --jit the step is XLA-compiled (train.jit_compile); XLA's buffers
come from the same allocator, so tf peak counts them too.
"""

import argparse
import json
import os
import time

from tests import bench
from tests.fixtures.processes import MEMORY_STATS_ENV

K = 3  # steps per train call


def measure(context: int, remat: bool, batch: int, rounds: int,
            jit: bool) -> dict:
  """One configuration, in this (fresh) process."""
  # Before TensorFlow makes its CPU device: an allocator that counts.
  os.environ.update(MEMORY_STATS_ENV)
  import resource  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from experiments import lm  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top

  c = lm.get_config()
  c.model.context, c.model.remat = context, remat
  c.train.batch_size, c.train.steps_per_loop = batch, K
  c.train.jit_compile = jit
  stream = np.random.default_rng(0).integers(
      0, 256, 4 * batch * context + 1).astype(np.int32)
  rows = np.arange(4 * batch)[:, None] * context + np.arange(context)
  c.dataset_fn = lambda config, split: (stream[rows], stream[rows + 1])
  trainer = pieces.trainer(c, tf.distribute.get_strategy())
  trainer.train(K)  # the trace
  tf.config.experimental.reset_memory_stats("CPU:0")
  secs = []
  for _ in range(rounds):
    start = time.perf_counter()
    trainer.train(K)
    secs.append((time.perf_counter() - start) / K)
  return dict(
      tf_peak_mb=tf.config.experimental.get_memory_info("CPU:0")["peak"]
      / 2**20,
      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      secs_per_step=float(np.median(secs)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--contexts", default="256,1024")
  parser.add_argument("--batch", type=int, default=8,
                      help="windows per step, at every context")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--jit", action="store_true",
                      help="XLA-compile the step (train.jit_compile)")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # child processes
  args = parser.parse_args()
  if args.one:
    context, remat = args.one.split(",")
    print(json.dumps(measure(int(context), remat == "1", args.batch,
                             args.rounds, args.jit)))
    return
  bench.header()
  print(f"batch {args.batch}, {'XLA' if args.jit else 'graph'}, {K} steps"
        " a call\n| context | remat | tf peak MB | rss MB | s/step |\n"
        "|---|---|---|---|---|", flush=True)
  for context in args.contexts.split(","):
    for remat in ("0", "1"):
      r = bench.child("tests.bench.lm_remat", f"--one={context},{remat}",
                      f"--batch={args.batch}", f"--rounds={args.rounds}",
                      *(["--jit"] if args.jit else []))
      if r:
        print(f"| {context} | {'on' if remat == '1' else 'off'} |"
              f" {r['tf_peak_mb']:.0f} | {r['rss_mb']:.0f} |"
              f" {r['secs_per_step']:.3f} |", flush=True)


if __name__ == "__main__":
  main()
