"""PNG screenshots of TensorBoard's tabs over a two-run sweep (headless Chromium).

Synopsis::

    apt-get install chromium            # Debian; once
    python -m tests.tools.screenshots --out=/tmp/looper-shots
    # -> scalars.png, hparams.png, text.png, profile.png (1400 x 900)

The sweep is the README quickstart shrunk (MNIST from experiments/data/mnist,
CNN width 16, 300 steps, a profile window on steps 201-205), twice: at
learning rates 1e-3 and 3e-3. TensorBoard serves it on 127.0.0.1 and
Chromium, started as the machine notes say (no background networking: this
machine has no network), renders each tab with 20 s of virtual time. What
each tab shows is written down in BUILD.md ("TensorBoard"). A command, not
a test: a browser and its pictures are for people to look at; the suite
reads the same data from TensorBoard's HTTP endpoints (test_tensorboard.py).
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from tests.fixtures.paths import MNIST_DIR, ROOT
from tests.fixtures.processes import LOOPBACK_ENV
from tests.fixtures.servers import fetch, tensorboard_server

TABS = ("scalars", "hparams", "text", "profile")
RATES = ("0.001", "0.003")


def train(workdir: pathlib.Path, rate: str) -> None:
  subprocess.run(
      [sys.executable, "-m", "looper.main", "--mode=train_and_eval",
       "--config=experiments/mnist.py", f"--workdir={workdir}",
       f"--config.data.dir={MNIST_DIR}",
       "--config.data.train_split=test[:8000]",
       "--config.data.eval_split=test[8000:]", "--config.model.width=16",
       "--config.train.batch_size=64", "--config.train.steps=300",
       "--config.eval.every_steps=100", "--config.checkpoint.every_steps=300",
       "--config.profile.start_step=200",
       f"--config.optimizer.learning_rate={rate}"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV),
      check=True, timeout=600)


def shoot(url: str, path: pathlib.Path, profile_dir: str) -> None:
  subprocess.run(
      [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox",
       "--disable-gpu", "--disable-quic", "--no-first-run",
       "--disable-background-networking", "--disable-component-update",
       "--disable-sync", f"--user-data-dir={profile_dir}",
       "--window-size=1400,900", "--virtual-time-budget=20000",
       f"--screenshot={path}", url],
      check=True, timeout=120, capture_output=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder for the PNGs")
  parser.add_argument("--logdir", help="a sweep to show instead (not made)")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    logdir = pathlib.Path(args.logdir or pathlib.Path(scratch) / "sweep")
    if not args.logdir:
      for rate in RATES:
        train(logdir / f"lr{rate}", rate)
    with tensorboard_server(logdir) as url:
      fetch(url, "/data/runs")  # up
      for tab in TABS:
        shoot(f"{url}/#{tab}", out / f"{tab}.png",
              os.path.join(scratch, "chromium"))
        print(out / f"{tab}.png")


if __name__ == "__main__":
  main()
