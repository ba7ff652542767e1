"""Wall time from launch to a target eval accuracy: looper vs Keras fit.

Synopsis::

    python -m tests.bench.time_to_accuracy              # ~10 minutes, 2 cores
    python -m tests.bench.time_to_accuracy --seeds=0,1 --precisions=float32
    python -m tests.bench.time_to_accuracy --task=fashion   # ~15 minutes

Tasks (TASKS), each through experiments/mnist.py, batch 128, Adam at a
constant 1e-3, K steps per call and an evaluation of the whole eval split
every K steps; a run stops at the first evaluation >= the target:
  mnist    97% on the offline split of the bundled MNIST test set (train
           'test[:8000]', eval 'test[8000:]', 2000 images), the guide's CNN
           at width 32, K=50.
  fashion  0.916 (the dataset's table lists the TensorFlow layers
           tutorial CNN there) on the full Fashion-MNIST (60,000 train,
           10,000 test), model.arch='tutorial', K=250.
Each run is a fresh process; the clock starts when the parent launches it,
so imports, TensorFlow's start-up, tracing and every evaluation count:
  looper  `run.run(experiments/mnist.py config)`, a Trainer subclass
          requesting a stop at the target (the stop's checkpoint is not
          timed);
  fit     `model.fit(steps_per_epoch=K, steps_per_execution=K,
          validation_data=..., validation_freq=1)`, a callback stopping at
          the target.
Both read the same files through experiments/mnist.py and are alternated
per seed. --order=same (default): fit trains on looper's own batches
(array mode's seeded order), so both need about the same steps and the
time measures the framework; --order=own: fit shuffles with a 10,000-
example buffer, so steps-to-target differ per seed by the shuffle's luck
(the spread is reported).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from tests.fixtures.paths import MNIST_DIR, ROOT
from tests.fixtures.processes import LOOPBACK_ENV

BATCH = 128
TASKS = {
    "mnist": dict(target=0.97, every=50, max_steps=3000, data=MNIST_DIR,
                  train="test[:8000]", eval="test[8000:]",
                  model={"width": 32}),
    "fashion": dict(target=0.916, every=250, max_steps=10_000,
                    data=ROOT.parent / "shared" / "data" / "fashion_mnist",
                    train="train", eval="test", model={"arch": "tutorial"}),
}
TASK = TASKS["mnist"]  # the child's, set by --one
ORDER = "same"  # the child's, set by --one
TARGET, EVERY, MAX_STEPS = TASK["target"], TASK["every"], TASK["max_steps"]


def _set_task(name: str) -> None:
  global TASK, TARGET, EVERY, MAX_STEPS
  TASK = TASKS[name]
  TARGET, EVERY, MAX_STEPS = TASK["target"], TASK["every"], TASK["max_steps"]


def _config(seed: int, precision: str):
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  c = mnist.get_config()
  c.seed = seed
  c.data.dir = str(TASK["data"])
  c.data.train_split, c.data.eval_split = TASK["train"], TASK["eval"]
  for field, value in TASK["model"].items():
    c.model[field] = value
  c.train.steps, c.train.batch_size, c.train.precision = (MAX_STEPS, BATCH,
                                                          precision)
  c.train.steps_per_loop = c.eval.every_steps = EVERY
  c.checkpoint.every_steps = 0  # only the stop's save, after the clock
  c.optimizer.schedule = "constant"
  return c


def run_looper(seed: int, precision: str) -> dict:
  from looper.train import evaluator as evaluator_lib  # pylint: disable=g-import-not-at-top
  from looper import run  # pylint: disable=g-import-not-at-top
  from looper.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  reached = {"imported": time.time()}
  evals, trainers = [], []

  class UntilTarget(evaluator_lib.Evaluator):
    def evaluate(self):
      start = time.time()
      results = super().evaluate()
      evals.append(time.time() - start)
      if results["accuracy"] >= TARGET and "time" not in reached:
        trainer = trainers[0]
        reached.update(time=time.time(), step=trainer.global_step,
                       accuracy=results["accuracy"], eval_secs=sum(evals))
        trainer.stop.request(f"accuracy {TARGET} reached")
      return results

  class FirstLoop(trainer_lib.Trainer):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      trainers.append(self)  # the run's: its step and stop request

    def on_loop_end(self, step, logs):
      reached.setdefault("first_loop", time.time())

  config = _config(seed, precision)
  config.trainer = FirstLoop
  evaluator_lib.Evaluator = UntilTarget  # what run builds (own process)
  with tempfile.TemporaryDirectory() as workdir:
    run.run(config, workdir, "train_and_eval")
  return reached


def run_fit(seed: int, precision: str) -> dict:
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  from looper.options import precision as precision_lib  # pylint: disable=g-import-not-at-top
  from looper.data import arrays  # pylint: disable=g-import-not-at-top
  reached = {"imported": time.time()}
  config = _config(seed, precision)
  keras.utils.set_random_seed(seed)
  with precision_lib.policy(precision):
    model = mnist.model_fn(config)
  model.compile(keras.optimizers.Adam(1e-3),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"], steps_per_execution=EVERY)
  examples = lambda split: tf.data.Dataset.from_tensor_slices(
      mnist.dataset_fn(config, split))  # the arrays looper gets
  if ORDER == "same":  # looper's batches, in looper's order
    train = arrays.Arrays(mnist.dataset_fn(config, config.data.train_split),
                          "train").train(
        tf.distribute.InputContext(), batch_size=BATCH, seed=seed,
        shuffle_buffer=config.data.shuffle_buffer, position=0)
  else:
    train = (examples(config.data.train_split)
             .shuffle(10_000, seed=seed).repeat()
             .batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
  evals = examples(config.data.eval_split).batch(
      config.eval.batch_size).cache()
  eval_times = []

  class UntilTarget(keras.callbacks.Callback):
    def on_test_begin(self, logs=None):
      reached.setdefault("first_loop", time.time())
      eval_times.append(-time.time())

    def on_test_end(self, logs=None):
      eval_times[-1] += time.time()

    def on_epoch_end(self, epoch, logs=None):
      if logs["val_accuracy"] >= TARGET and "time" not in reached:
        reached.update(time=time.time(), step=(epoch + 1) * EVERY,
                       accuracy=logs["val_accuracy"], eval_secs=sum(eval_times))
        self.model.stop_training = True

  model.fit(train, steps_per_epoch=EVERY, epochs=MAX_STEPS // EVERY,
            validation_data=evals, callbacks=[UntilTarget()], verbose=0)
  return reached


def _child(task: str, contender: str, seed: int, precision: str,
           order: str) -> dict | None:
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  start = time.time()
  proc = subprocess.run(
      [sys.executable, "-m", "tests.bench.time_to_accuracy",
       f"--one={task},{contender},{seed},{precision},{order}"], cwd=ROOT,
      env=env,
      timeout=1800, capture_output=True, text=True, check=False)
  if proc.returncode:
    print(f"{contender} seed {seed} {precision}: failed\n"
          f"{proc.stderr[-1500:]}", flush=True)
    return None
  reached = json.loads(proc.stdout.strip().splitlines()[-1])
  if "time" not in reached:
    return {"secs": None, "step": None}
  return {"secs": reached["time"] - start, "step": reached["step"],
          # launch -> imports done -> first K-step loop done; eval total
          "imports": reached["imported"] - start,
          "first_loop": reached["first_loop"] - reached["imported"],
          "eval": reached["eval_secs"]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", default="mnist", choices=list(TASKS))
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--precisions", default="float32,mixed_bfloat16")
  parser.add_argument(
      "--order", default="same", choices=["same", "own"],
      help="same: fit trains on looper's batches in looper's order (steps"
      " to target match: the time is the framework's); own: each shuffles"
      " with its own pipeline (fit: a 10,000-example buffer)")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # child processes
  args = parser.parse_args()
  if args.one:
    global ORDER
    task, contender, seed, precision, ORDER = args.one.split(",")
    _set_task(task)
    fn = run_looper if contender == "looper" else run_fit
    print(json.dumps(fn(int(seed), precision)))
    return
  target = TASKS[args.task]["target"]
  print(f"| precision | contender | seconds to {target:g} (median, min-max) |"
        " steps and seconds (per seed) | median: launch to imports done, then to the"
        " first loop's end; all evals |")
  print("|---|---|---|---|---|")
  for precision in args.precisions.split(","):
    runs = {"looper": [], "fit": []}
    for seed in args.seeds.split(","):
      for contender in runs:
        runs[contender].append(_child(args.task, contender, int(seed),
                                      precision, args.order))
    for contender, results in runs.items():
      secs = [r["secs"] for r in results if r and r["secs"] is not None]
      steps = [f"{r['step']} in {r['secs']:.1f}s" if r and r["secs"]
               else "failed" if not r else "never" for r in results]
      spread = (f"{np.median(secs):.1f} ({min(secs):.1f}-{max(secs):.1f})"
                if secs else "never")
      parts = " ".join(
          f"{k}={np.median([r[k] for r in results if r and r['secs']]):.1f}s"
          for k in ("imports", "first_loop", "eval") if secs)
      print(f"| {precision} | {contender} | {spread} | {steps} | {parts} |",
            flush=True)


if __name__ == "__main__":
  main()
