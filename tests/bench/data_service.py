"""Examples/s of JPEG decoding in the trainer vs on tf.data service workers.

Synopsis::

    python -m tests.bench.data_service               # ~4 minutes on 2 cores
    python -m tests.bench.data_service --width=4     # input-bound everywhere
    python -m tests.bench.data_service --steps=200 --threads=1 --image_size=32

Writes 16 TFRecord files of 192x192 JPEGs in the flowers format, then
trains experiments/tfrecord_images.py (decode of every 192x192 JPEG and a
resize to `--image_size` as it is read) in `--mode=train`, a CNN of
`--width` filters: at 16 a step costs the trainer's CPU about what
decoding its batch does, at 4 the step is cheap and decoding limits:
  local      the trainer's own input pipeline, its tf.data thread pool
             limited to `--threads` (a host whose CPUs cannot keep up);
  service N  `--config.data.service` with a `looper data_service`
             dispatcher and N workers (processes of their own), which
             decode with all their threads.
The trainer runs on CPU 0 only and the servers on the others: a host and
the machines beside it, on one machine (with one CPU all share it).
Reports the median `examples_per_sec` of the loops after the first (the
trace) and the median `input_wait_fraction`, read back from the events.
Every process it starts is ended by PID.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf

from looper.data import shards
from tests import bench
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import LOOPBACK_ENV

FILES, PER_FILE, SIZE = 16, 64, 192
# The trainer's host: CPU 0; the service's machines: the other CPUs.
TRAINER_CPUS = {0}
SERVICE_CPUS = set(range(1, os.cpu_count())) or {0}


def get_config():
  """experiments/tfrecord_images.py with the train pipeline's threads
  limited to data.threads (dataset_fn below)."""
  from experiments import tfrecord_images  # pylint: disable=g-import-not-at-top
  from looper import config as lc  # pylint: disable=g-import-not-at-top
  c = tfrecord_images.get_config()
  c.dataset_fn = "tests.bench.data_service:dataset_fn"
  c.data.threads = lc.whole(1)
  return c


def dataset_fn(config, split):
  from experiments import tfrecord_images  # pylint: disable=g-import-not-at-top
  files = tfrecord_images.dataset_fn(config, split)
  return Limited(files.paths, files.parse, counts=files.counts,
                 split=files.split, threads=config.data.threads)


class Limited(shards.Files):
  """Files whose local train pipeline runs on `threads` threads."""

  def __init__(self, *args, threads: int, **kwargs):
    super().__init__(*args, **kwargs)
    self.threads = threads

  def train(self, ctx, **kwargs):
    options = tf.data.Options()
    options.threading.private_threadpool_size = self.threads
    return super().train(ctx, **kwargs).with_options(options)


def write_records(directory: str) -> None:
  """FILES files of PER_FILE noisy SIZE x SIZE JPEGs, 5 classes."""
  rng = np.random.default_rng(0)
  os.makedirs(directory)
  for f in range(FILES):
    path = os.path.join(directory, f"flowers{f:02d}-{PER_FILE}.tfrec")
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(PER_FILE):
        label = int(rng.integers(5))
        image = np.clip(rng.normal(50 * label, 40, (SIZE, SIZE, 3)), 0, 255)
        jpeg = tf.io.encode_jpeg(image.astype(np.uint8), quality=90).numpy()
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[jpeg])),
            "class": tf.train.Feature(int64_list=tf.train.Int64List(
                value=[label]))})).SerializeToString())


def _pinned(cpus):
  """Runs the child on `cpus` only (what TensorFlow then sizes its thread
  pools by): the trainer's host and the service's CPUs, apart."""
  return lambda: os.sched_setaffinity(0, cpus)


def _env():
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  env.pop("TF_CONFIG", None)
  return env


def _servers(workers: int) -> tuple[str, list[subprocess.Popen]]:
  """A dispatcher and `workers` workers, each announced (its start line
  printed); returns the dispatcher's address and the processes."""
  from looper.cli import launch  # pylint: disable=g-import-not-at-top
  ports = launch.free_ports(workers + 1)
  command = [sys.executable, "-m", "looper.main", "data_service"]
  roles = [["--role=dispatcher"]] + [
      ["--role=worker", f"--dispatcher=localhost:{ports[0]}"]] * workers
  procs = []
  for flags, port in zip(roles, ports):
    procs.append(subprocess.Popen(
        # Up for minutes, serving random JPEGs: on any machine's addresses.
        command + flags + [f"--port={port}", "--network=public"],
        cwd=ROOT, env=_env(),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        preexec_fn=_pinned(SERVICE_CPUS)))
    procs[-1].stdout.readline()  # its start line: it serves
  return f"localhost:{ports[0]}", procs


def run(records: str, workdir: str, args, service: str = "") -> dict:
  flags = [f"--config={__file__}", f"--config.data.dir={records}",
           "--mode=train", f"--workdir={workdir}",
           f"--config.train.steps={args.steps}",
           "--config.train.steps_per_loop=10", f"--config.train.batch_size={args.batch_size}",
           "--config.data.virtual_shards=4", f"--config.model.width={args.width}",
           f"--config.model.image_size={args.image_size}",
           f"--config.data.threads={args.threads}",
           "--config.checkpoint.every_steps=100000",
           f"--config.data.service={service}"]
  proc = subprocess.run([sys.executable, "-m", "looper.main", *flags],
                        cwd=ROOT, env=_env(), timeout=1200,
                        capture_output=True, text=True, check=False,
                        preexec_fn=_pinned(TRAINER_CPUS))
  if proc.returncode:
    raise RuntimeError(proc.stderr[-2000:])
  return bench.steady(os.path.join(workdir, "train"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--threads", type=int, default=1)
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--width", type=int, default=16)
  args = parser.parse_args()
  bench.header()
  with tempfile.TemporaryDirectory() as tmp:
    records = os.path.join(tmp, "records")
    write_records(records)
    for workers in (0, 1, 2):
      address, procs = _servers(workers) if workers else ("", [])
      try:
        result = run(records, os.path.join(tmp, f"run{workers}"), args,
                     service=address)
      finally:
        for proc in procs:
          proc.send_signal(signal.SIGTERM)
        for proc in procs:
          try:
            proc.wait(timeout=30)
          finally:
            proc.kill()
      name = f"service, {workers} worker(s)" if workers else (
          f"local, {args.threads} thread(s)")
      print(f"{name:22s} {result['examples_per_sec']:8.1f} examples/s,"
            f" input wait {result['input_wait']:.1%}", flush=True)


if __name__ == "__main__":
  main()
