"""Examples/s of file mode vs element mode on a TFRecord copy of MNIST.

Synopsis::

    python -m tests.bench.input_modes               # ~5 minutes on 2 cores
    python -m tests.bench.input_modes --steps=600 --width=32

Writes the bundled MNIST test set (10,000 images) as 64 TFRecord shards, then
trains the MNIST CNN from them in `--mode=train` on 1 process and on 2
workers (`looper.cli.launch`), reading them two ways:
  element  dataset_fn returns the parsed TFRecordDataset (every pipeline
           reads every file and keeps 1/N);
  file     `--config.data.shards_dir` (each pipeline reads only its files).
Reports the median `examples_per_sec` of the loops after the first (the
trace) and the median `input_wait_fraction`, read back from the events.
"""

import argparse
import os
import subprocess
import sys
import tempfile

from tests import bench
from tests.fixtures.paths import MNIST_DIR, ROOT
from tests.fixtures.processes import LOOPBACK_ENV


def get_config():
  """experiments/mnist.py reading the shards as ONE Dataset (element mode)."""
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  c = mnist.get_config()
  c.dataset_fn = "tests.bench.input_modes:element_dataset_fn"
  c.data.records = ""  # the directory write_records() filled
  return c


def element_dataset_fn(config, split):
  from looper.data import shards  # pylint: disable=g-import-not-at-top
  return shards.read(os.path.join(config.data.records, split)).examples()


def write_records(directory: str) -> None:
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  from looper.data import shards  # pylint: disable=g-import-not-at-top
  c = mnist.get_config()
  c.data.dir = str(MNIST_DIR)
  for split in ("train", "test"):  # both from the 10k test images
    shards.write(shards.as_dataset(mnist.dataset_fn(c, "test"), "test"),
                 os.path.join(directory, split))


def run(mode: str, workers: int, records: str, workdir: str, args) -> dict:
  if mode == "element":
    flags = [f"--config={__file__}", f"--config.data.records={records}"]
  else:
    flags = ["--config=experiments/mnist.py",
             f"--config.data.shards_dir={records}"]
  flags += ["--mode=train", f"--workdir={workdir}",
           f"--config.train.steps={args.steps}",
           "--config.train.steps_per_loop=50",
           f"--config.model.width={args.width}",
           "--config.checkpoint.every_steps=100000",
           # launch's workers would be loopback: the bench hosts have a LAN.
           "--config.distribution.network=private"]
  command = ([sys.executable, "-m", "looper.cli.launch", f"--workers={workers}",
              "--"] if workers > 1 else [sys.executable, "-m", "looper.main"])
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  env.pop("TF_CONFIG", None)
  proc = subprocess.run(command + flags, cwd=ROOT, env=env, timeout=1200,
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])
  return bench.steady(os.path.join(workdir, "train"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--width", type=int, default=16)
  args = parser.parse_args()
  bench.header()
  with tempfile.TemporaryDirectory() as tmp:
    records = os.path.join(tmp, "records")
    write_records(records)
    for workers in (1, 2):
      for mode in ("element", "file"):
        result = run(mode, workers, records,
                     os.path.join(tmp, f"{mode}{workers}"), args)
        print(f"{mode:7s} mode, {workers} worker(s):"
              f" {result['examples_per_sec']:8.0f} examples/s,"
              f" input wait {result['input_wait']:.1%}", flush=True)


if __name__ == "__main__":
  main()
