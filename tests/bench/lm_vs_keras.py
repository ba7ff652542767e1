"""Bits per byte and wall time: looper's LM defaults vs plain Keras `fit`.

Synopsis::

    python -m tests.bench.lm_vs_keras           # 3 seeds each, ~20 minutes
    python -m tests.bench.lm_vs_keras --seeds=0 --data=/data/pydocs
    python -m tests.bench.lm_vs_keras --looper_flags="--config.train.steps=1200"

Issue 26's comparison, one run after the other on the same machine:
  looper  `python -m looper.main --config=experiments/lm.py
          --config.data.dir=DATA --config.seed=S` (its defaults, plus
          --looper_flags), the final eval's `bits_per_byte` read back from
          metrics.jsonl;
  keras   the same model size written here in plain Keras 3 and trained
          with `fit` the way nanoGPT trains its baby GPT on a CPU (its
          README's command: 4 layers, 4 heads, width 128, context 64,
          dropout 0; batch 12, 2000 iterations, a random window offset for
          every example; AdamW at 1e-3, 100 warm-up steps, cosine to 1e-4,
          beta_2 0.99, weight decay 0.1 on the matrices only, clipping at
          1.0: nanoGPT's train.py defaults), Keras' default initializers,
          a separate output Dense, XLA as `fit` chooses ("auto").
Both train on every file of DATA but faq/ and are scored on every byte of
faq/ exactly once (experiments/text/data.py's split; eval windows side by
side, the last padded with weight 0, as looper's). Each contender is a
fresh process; its wall time runs from launch to exit (imports, tracing,
evaluation and looper's checkpoint saves count) and its peak RSS is the
kernel's (wait4). Prints a row per run and the medians per contender.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from tests import bench
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import LOOPBACK_ENV

DATA = ROOT.parent / "shared" / "data" / "text" / "pydocs"
# nanoGPT's baby GPT (README: "a baby GPT on CPU") and its train.py defaults.
CONTEXT, WIDTH, LAYERS, HEADS = 64, 128, 4, 4
BATCH, STEPS, WARMUP, PEAK, FLOOR = 12, 2000, 100, 1e-3, 1e-4


def keras_run(data_dir: str, seed: int) -> dict:
  """Trains the plain-Keras baby GPT; returns its eval bits per byte."""
  import keras  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from experiments.text import data  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(seed)
  options = ml_collections.ConfigDict(dict(
      dir=data_dir, eval_glob="faq/*", eval_fraction=0.1, cache_dir="",
      url="", file_hash=""))
  stream = np.frombuffer(data.corpus(options, "train"), np.uint8)
  ids = keras.Input((CONTEXT,), dtype="int32")
  x = keras.layers.Embedding(256, WIDTH)(ids)
  # Positions from the symbolic input: an Embedding called on a constant
  # would run once while the model is built, a frozen table.
  x = x + keras.layers.Embedding(CONTEXT, WIDTH)(
      keras.ops.zeros_like(ids) + keras.ops.arange(CONTEXT)[None])
  for _ in range(LAYERS):
    h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
    x = x + keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(
        h, h, use_causal_mask=True)
    h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
    h = keras.layers.Dense(4 * WIDTH, activation="gelu")(h)
    x = x + keras.layers.Dense(WIDTH)(h)
  x = keras.layers.LayerNormalization(epsilon=1e-5)(x)
  model = keras.Model(ids, keras.layers.Dense(256)(x))
  schedule = keras.optimizers.schedules.CosineDecay(
      0.0, STEPS - WARMUP, alpha=FLOOR / PEAK, warmup_target=PEAK,
      warmup_steps=WARMUP)
  optimizer = keras.optimizers.AdamW(schedule, beta_2=0.99, weight_decay=0.1,
                                     global_clipnorm=1.0)
  # nanoGPT decays the 2-D parameters only (matrices and embeddings).
  optimizer.exclude_from_weight_decay(
      var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
  model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  tokens = tf.constant(stream)
  top = len(stream) - CONTEXT - 1

  def window(offset):
    chunk = tf.cast(tokens[offset:offset + CONTEXT + 1], tf.int32)
    return chunk[:-1], chunk[1:]

  train = (tf.data.Dataset.random(seed=seed).map(lambda r: r % top)
           .map(window).batch(BATCH, drop_remainder=True)
           .prefetch(tf.data.AUTOTUNE))
  model.fit(train, steps_per_epoch=STEPS, epochs=1, verbose=0,
            shuffle=False)
  # Every eval byte but the first a label once: windows side by side, the
  # last padded (weight 0).
  held_out = np.frombuffer(data.corpus(options, "eval"), np.uint8)
  count = -(-(len(held_out) - 1) // CONTEXT)
  padded = np.zeros(count * CONTEXT + 1, np.int32)
  padded[:len(held_out)] = held_out
  labels = padded[1:].reshape(count, CONTEXT)
  weights = (np.arange(1, count * CONTEXT + 1) < len(held_out)).reshape(
      count, CONTEXT)
  logits = model.predict(padded[:-1].reshape(count, CONTEXT), batch_size=256,
                         verbose=0)
  nats = keras.ops.convert_to_numpy(
      keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                   from_logits=True))
  return {"bits_per_byte": float((nats * weights).sum() / weights.sum()
                                 / math.log(2))}


def looper_run(data_dir: str, seed: int, flags: list[str]) -> dict:
  """Trains experiments/lm.py; returns its last eval's bits per byte."""
  from looper.workdir import jsonl  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as workdir:
    subprocess.run(
        [sys.executable, "-m", "looper.main", "--config=experiments/lm.py",
         f"--config.data.dir={data_dir}", f"--config.seed={seed}",
         f"--workdir={workdir}", *flags], cwd=ROOT, env=_env(), check=True,
        capture_output=True, timeout=3600)
    evals = [line for line in jsonl.read(os.path.join(workdir,
                                                      "metrics.jsonl"))
             if line["kind"] == "eval"]
  return {"bits_per_byte": evals[-1]["bits_per_byte"]}


def _env() -> dict:
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  env.pop("TF_CONFIG", None)
  return env


def _measured(contender: str, args, seed: int) -> dict:
  """One contender's run in a fresh process: its result, wall seconds and
  peak RSS (the process and its children, from the kernel)."""
  start = time.monotonic()
  proc = subprocess.Popen(
      [sys.executable, "-m", "tests.bench.lm_vs_keras", f"--one={contender}",
       f"--seeds={seed}", f"--data={args.data}",
       f"--looper_flags={args.looper_flags}"], cwd=ROOT, env=_env(),
      stdout=subprocess.PIPE, text=True)
  out = proc.stdout.read()
  _, status, usage = os.wait4(proc.pid, 0)
  wall = time.monotonic() - start
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode:
    raise RuntimeError(f"{contender} seed {seed} exited {proc.returncode}")
  # The looper side runs looper.main in a child of its own: ru_maxrss of a
  # process is its own peak; the grandchild's is the larger of the two.
  result = json.loads(out.strip().splitlines()[-1])
  peak = max(usage.ru_maxrss, result.pop("child_peak_kb", 0)) / 2**20
  return dict(result, wall=wall, peak_gb=peak)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--data", default=str(DATA))
  parser.add_argument("--looper_flags", default="",
                      help="more looper flags, space-separated")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # child processes
  args = parser.parse_args()
  if args.one:
    seed = int(args.seeds)
    if args.one == "keras":
      result = keras_run(args.data, seed)
    else:
      result = looper_run(args.data, seed, args.looper_flags.split())
      import resource  # pylint: disable=g-import-not-at-top
      result["child_peak_kb"] = resource.getrusage(
          resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps(result))
    return
  bench.header()
  print(f"data {args.data}", flush=True)
  print("| contender | seed | eval bits/byte | wall s | peak RSS GB |")
  print("|---|---|---|---|---|")
  runs = {"looper": [], "keras": []}
  for seed in map(int, args.seeds.split(",")):
    for contender, results in runs.items():
      results.append(_measured(contender, args, seed))
      r = results[-1]
      print(f"| {contender} | {seed} | {r['bits_per_byte']:.3f} |"
            f" {r['wall']:.0f} | {r['peak_gb']:.2f} |", flush=True)
  for contender, results in runs.items():
    medians = {k: np.median([r[k] for r in results])
               for k in ("bits_per_byte", "wall", "peak_gb")}
    print(f"| {contender} | median | {medians['bits_per_byte']:.3f} |"
          f" {medians['wall']:.0f} | {medians['peak_gb']:.2f} |", flush=True)


if __name__ == "__main__":
  main()
