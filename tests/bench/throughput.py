"""Throughput: looper vs the TPU guide's loop, a bare floor and Keras fit.

Synopsis::

    python -m tests.bench.throughput                    # every configuration
    python -m tests.bench.throughput --models=mlp --replicas=1 --rounds=3
    python -m tests.bench.throughput --replicas=1 --batch=256
    python -m tests.bench.throughput --phases   # looper's first loop, split
    python -m tests.bench.throughput --models=mlp --replicas=2 \
        --precisions=float32 --clip=1.0    # + looper with clipping

Each configuration (model x replicas x precision) runs in its own process
(logical CPUs and the dtype policy are fixed per process) and alternates
rounds of the four contenders on the same data, batch and K steps per call:
  looper  the public API, `Trainer(...).train(K)` (tests/fixtures/pieces.py);
  guide   the "Use TPUs" guide's custom loop (written here): tf.data with
          distribute_datasets_from_function, K steps of strategy.run in a
          tf.range loop inside one tf.function, compute_average_loss;
  floor   the same step K times in one tf.function over ONE pre-batched
          resident batch: no tf.data, no metrics, no loss collection;
  fit     Keras `model.fit(steps_per_execution=K)` (with 2 replicas Keras
          3 fails for K > 1 on this stack: recorded, then K=1).
Models: the 784-512-512-10 MLP and the MNIST CNN at width 32, on the real
MNIST test images. Reports the median examples/s over rounds, the paired
ratios (looper / each, per round, then the median), and the time from
construction to the end of the first K-step call with the peak resident
memory after 3 more calls, each contender in a fresh process (a process's
first tf.function pays ~1 s of one-time costs).
"""

import argparse
import json
import time

from tests import bench
from tests.fixtures.paths import MNIST_DIR

BATCH, K = 128, 50


def _data():
  import ml_collections  # pylint: disable=g-import-not-at-top
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  images, labels = mnist.load_mnist(
      "test", ml_collections.ConfigDict({"dir": str(MNIST_DIR)}))
  return (images.astype("float32")[..., None] / 255.0,
          labels.astype("int32"))


def _config(model: str, precision: str, images, labels):
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  c = mnist.get_config()
  c.model.width = 32
  c.train.batch_size, c.train.steps, c.train.steps_per_loop = BATCH, 10**6, K
  c.train.precision = precision
  c.optimizer.schedule = "constant"
  c.data.shuffle_buffer = 10_000
  if model == "mlp":
    c.model_fn = mlp
  c.dataset_fn = lambda config, split: (images, labels)  # array mode
  return c


def mlp(config):
  import keras  # pylint: disable=g-import-not-at-top
  del config
  return keras.Sequential([
      keras.Input((28, 28, 1)), keras.layers.Flatten(),
      keras.layers.Dense(512, activation="relu"),
      keras.layers.Dense(512, activation="relu"),
      keras.layers.Dense(10, dtype="float32")])


def _contenders(model, replicas, precision, clip=0.0):
  """{name: (build() -> step()), ...}; step() runs K steps and returns."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from looper.options import precision as precision_lib  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top

  strategy = (tf.distribute.MirroredStrategy(distribute.split_cpu(replicas))
              if replicas > 1 else tf.distribute.get_strategy())
  images, labels = _data()
  config = _config(model, precision, images, labels)

  def looper_build(clip_norm=0.0):
    c = config.copy_and_resolve_references()
    c.optimizer.clip_global_norm = clip_norm
    trainer = pieces.trainer(c, strategy)
    return lambda: trainer.train(K)

  def keras_parts():
    with precision_lib.policy(precision):
      net = config.model_fn(config)
    return net, keras.optimizers.Adam(1e-3)

  def replica_step(net, opt):
    """The guide's per-replica step (the floor runs it too)."""
    def step(x, y):
      with tf.GradientTape() as tape:
        logits = tf.cast(net(x, training=True), tf.float32)
        loss = tf.nn.compute_average_loss(
            keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True), global_batch_size=BATCH)
      opt.apply_gradients(zip(tape.gradient(loss, net.trainable_variables),
                              net.trainable_variables))
      return loss
    return step

  def guide_build():
    with strategy.scope():
      net, opt = keras_parts()
      opt.build(net.trainable_variables)
    def dataset_fn(ctx):
      per_replica = ctx.get_per_replica_batch_size(BATCH)
      return (tf.data.Dataset.from_tensor_slices((images, labels))
              .shuffle(10_000, seed=0).repeat().shard(
                  ctx.num_input_pipelines, ctx.input_pipeline_id)
              .batch(per_replica, drop_remainder=True).prefetch(2))
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    step = replica_step(net, opt)

    @tf.function
    def train(steps):
      for _ in tf.range(steps):
        strategy.run(step, args=next(iterator))
    return lambda: train(tf.constant(K))

  def floor_build():
    with strategy.scope():
      net, opt = keras_parts()
      opt.build(net.trainable_variables)
    per_replica = BATCH // replicas
    batch = strategy.experimental_distribute_values_from_function(
        lambda ctx: (tf.constant(images[:per_replica]),
                     tf.constant(labels[:per_replica])))

    step = replica_step(net, opt)

    @tf.function
    def train(steps):
      for _ in tf.range(steps):
        strategy.run(step, args=batch)
    return lambda: train(tf.constant(K))

  def fit_build(steps_per_execution):
    with strategy.scope():
      net, opt = keras_parts()
      net.compile(opt, keras.losses.SparseCategoricalCrossentropy(
          from_logits=True), metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)
    data = (tf.data.Dataset.from_tensor_slices((images, labels))
            .shuffle(10_000, seed=0).repeat().batch(BATCH).prefetch(2))
    return lambda: net.fit(data, steps_per_epoch=K, epochs=1, verbose=0)

  contenders = dict(looper=looper_build, guide=guide_build,
                    floor=floor_build, fit=lambda: fit_build(K))
  if clip:  # optimizer.clip_global_norm: what clipping costs looper
    contenders["looper+clip"] = lambda: looper_build(clip)
  return contenders, lambda: fit_build(1)


def _build(contenders, fit_k1, name, notes):
  """The contender's K-step function, after its first call."""
  try:
    step = contenders[name]()
    step()
  except Exception as e:  # pylint: disable=broad-except
    notes[name] = f"K={K} failed ({type(e).__name__}); K=1"
    step = fit_k1()
    step()
  return step


def first_loop(model: str, replicas: int, precision: str, name: str,
               clip: float = 0.0) -> dict:
  """Seconds from building `name` to the end of its first K-step call, in
  a fresh process (the first tf.function of a process pays one-time costs
  that would otherwise go to whichever contender runs first), and the
  process's peak resident memory after 3 more calls."""
  import resource  # pylint: disable=g-import-not-at-top
  contenders, fit_k1 = _contenders(model, replicas, precision, clip)
  start = time.perf_counter()
  step = contenders[name]()  # set-up: model, optimizer, data, metrics
  built = time.perf_counter()
  try:
    step()  # the first call: tracing, then K steps
  except Exception:  # pylint: disable=broad-except
    step = _build(contenders, fit_k1, name, {})  # fit at K=1
  secs = time.perf_counter() - start
  for _ in range(3):
    step()
  # ru_maxrss is in KiB on Linux.
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  return {"secs": secs, "build_secs": built - start, "peak_mb": peak_mb}


def phases(model: str = "mlp", precision: str = "float32") -> str:
  """Where looper's first loop goes, one replica, in this (fresh) process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  images, labels = _data()
  config = _config(model, precision, images, labels)
  times = [time.perf_counter()]
  trainer = pieces.trainer(config, tf.distribute.get_strategy())
  times.append(time.perf_counter())
  iterator = trainer.input.train_iterator()
  times.append(time.perf_counter())
  trainer._loop.function.get_concrete_function(  # pylint: disable=protected-access
      iterator, tf.constant(K))
  times.append(time.perf_counter())
  for _ in range(2):
    trainer.train(K)
    times.append(time.perf_counter())
  names = ("Trainer()", "train iterator", "trace",
           "first train(K)", "second train(K)")
  return "  ".join(f"{n} {b - a:.2f}s" for n, a, b in
                   zip(names, times, times[1:]))


def measure(model: str, replicas: int, precision: str, rounds: int,
            clip: float = 0.0) -> dict:
  """One configuration, in this process: alternating rounds."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  contenders, fit_k1 = _contenders(model, replicas, precision, clip)
  notes = {}
  steps = {name: _build(contenders, fit_k1, name, notes)
           for name in contenders}
  speeds = {name: [] for name in steps}
  for _ in range(rounds):
    for name, step in steps.items():
      start = time.perf_counter()
      for _ in range(3):
        step()
      speeds[name].append(3 * K * BATCH / (time.perf_counter() - start))
  looper = np.array(speeds["looper"])
  return dict(
      model=model, replicas=replicas, precision=precision, notes=notes,
      examples_per_sec={n: float(np.median(s)) for n, s in speeds.items()},
      ratio={n: float(np.median(looper / np.array(s)))
             for n, s in speeds.items() if n != "looper"})


def main():
  global BATCH
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="mlp,cnn")
  parser.add_argument("--replicas", default="1,2")
  parser.add_argument("--precisions", default="float32,mixed_bfloat16")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--batch", type=int, default=128,
                      help="the global batch of every contender")
  parser.add_argument("--clip", type=float, default=0.0,
                      help="also run looper with optimizer.clip_global_norm"
                      " at this norm ('looper+clip')")
  parser.add_argument("--one", help=argparse.SUPPRESS)  # child processes
  parser.add_argument("--first", help=argparse.SUPPRESS)
  parser.add_argument("--phases", action="store_true",
                      help="time the phases of looper's first loop (MLP,"
                      " 1 replica) in this process, and stop")
  args = parser.parse_args()
  BATCH = args.batch
  if args.phases:
    print(phases())
    return
  if args.one:
    model, replicas, precision = args.one.split(",")
    print(json.dumps(
        first_loop(model, int(replicas), precision, args.first, args.clip)
        if args.first else
        measure(model, int(replicas), precision, args.rounds, args.clip)))
    return
  bench.header()
  for model in args.models.split(","):
    for replicas in args.replicas.split(","):
      for precision in args.precisions.split(","):
        one = f"--one={model},{replicas},{precision}"
        common = (f"--clip={args.clip}", f"--batch={args.batch}")
        r = bench.child("tests.bench.throughput", one,
                        f"--rounds={args.rounds}", *common)
        if r is None:
          continue
        r["first_loop_secs"] = {
            name: bench.child("tests.bench.throughput", one,
                              f"--first={name}", *common)
            for name in r["examples_per_sec"]}
        speeds = " ".join(f"{n}={v:.0f}" for n, v in
                          r["examples_per_sec"].items())
        ratios = " ".join(f"looper/{n}={v:.3f}" for n, v in r["ratio"].items())
        first = " ".join(
            f"{n}={v['secs']:.1f}s (set-up {v['build_secs']:.1f}s)"
            f"/{v['peak_mb']:.0f}MB"
            for n, v in r["first_loop_secs"].items() if v)
        print(f"| {model} | {replicas} | {precision} | {speeds} | {ratios} |"
              f" {first} | {'; '.join(r['notes'].values())} |", flush=True)


if __name__ == "__main__":
  main()
