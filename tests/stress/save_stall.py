"""How long a checkpoint save stalls training, sync vs async.

Synopsis::

    python -m tests.stress.save_stall            # ~1 minute

A 5.3M-parameter MLP with Adam (a 63 MB checkpoint) under the default
strategy; between saves the weights change (as training would). Reports the
median and max time `Checkpointer.save` blocks the caller, over interleaved
rounds, and for async also the time the background write takes (`wait`).
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from looper import workdir
from looper.workdir import checkpoint


def main(rounds: int = 9) -> int:
  model = keras.Sequential([keras.Input((1024,)),
                            keras.layers.Dense(2048, activation="relu"),
                            keras.layers.Dense(1024, activation="relu"),
                            keras.layers.Dense(1024)])
  optimizer = keras.optimizers.Adam()
  optimizer.build(model.trainable_variables)
  params = sum(int(tf.size(v)) for v in model.trainable_variables)
  base = tempfile.mkdtemp(prefix="looper-stall-")
  savers = {mode: checkpoint.Checkpointer(
      workdir.Workdir(os.path.join(base, mode)), {"model": model, "optimizer": optimizer},
      keep=2, chief=True, task_id=0, async_save=mode == "async")
            for mode in ("sync", "async")}
  blocked = {"sync": [], "async": []}
  background = []
  for step in range(1, rounds + 2):
    for mode, saver in savers.items():
      for v in model.trainable_variables:  # "training" between saves
        v.assign_add(tf.ones_like(v) * 1e-3)
      start = time.perf_counter()
      saver.save(step)
      blocked[mode].append(time.perf_counter() - start)
      if mode == "async":
        start = time.perf_counter()
        saver.wait()
        background.append(time.perf_counter() - start)
  print(f"{params / 1e6:.2f}M parameters + Adam slots, {rounds} saves each"
        " (the first, which traces, left out)")
  for mode, times in blocked.items():
    times = times[1:]
    print(f"{mode:5s}: save() blocks {1000 * statistics.median(times):.1f} ms"
          f" median, {1000 * max(times):.1f} ms max")
  print(f"async: the background write then takes"
        f" {1000 * statistics.median(background[1:]):.1f} ms median")
  return 0


if __name__ == "__main__":
  sys.exit(main())
