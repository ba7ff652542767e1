"""Soak: minutes of a tiny model, its resident memory sampled every loop.

Synopsis::

    python -m tests.stress.soak                    # 5 minutes
    python -m tests.stress.soak --minutes=30 --max_slope=1
    python -m tests.stress.soak --flags="--config.checkpoint.async_save=True"

Runs `python -m looper.main` on MNIST's bundled data (width 8, loops of 100
steps, an eval every 5,000 steps and a checkpoint every 2,000: issue 28's
30-minute soak) for --minutes, then sends it SIGTERM (the agreed stop: it
saves and exits 0). At each progress line (one per train loop) the run's
VmRSS, threads and open file descriptors are read from /proc. Prints the
loops, steps, evaluations and saves, RSS at the warm-up's end (--warmup, a
share of the loops) and at the end, the least-squares slope of RSS over the
loops after the warm-up in KB per loop (with its standard error) and the
growth between steps of >= 4 MB (each listed), the slope in each quarter of
the loops after the warm-up (a plateau shows as quarters falling to zero,
which one slope over the whole run hides), and threads and open fds at the
first and last loop. Exit 1 if the run did not exit 0 or the slope is
above --max_slope.
"""

import argparse
import collections
import dataclasses
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

import numpy as np

from tests.fixtures.processes import popen_looper

ARGS = ("--config=experiments/mnist.py:bundled", "--config.model.width=8",
        "--config.train.steps=1000000000", "--config.train.steps_per_loop=100",
        "--config.eval.every_steps=5000",
        "--config.checkpoint.every_steps=2000")
PROGRESS = re.compile(r"train step +(\d+)/")


@dataclasses.dataclass
class Sample:
  """The run's state when the progress line of a loop was read."""
  seconds: float  # since the run started
  step: int
  rss_kb: int
  threads: int
  fds: int


def sample(pid: int, seconds: float, step: int) -> Sample | None:
  """`pid`'s VmRSS, threads and open fds; None once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      status = dict(line.split(":", 1) for line in f)
    fds = len(os.listdir(f"/proc/{pid}/fd"))
  except (FileNotFoundError, ProcessLookupError):
    return None
  return Sample(seconds, step, int(status["VmRSS"].split()[0]),
                int(status["Threads"]), fds)


def slope(samples: list[Sample]) -> tuple[float, float]:
  """(KB per loop, its standard error) of RSS by least squares."""
  x = np.arange(len(samples), dtype=np.float64)
  y = np.array([s.rss_kb for s in samples], np.float64)
  a, b = np.polyfit(x, y, 1)
  residuals = y - (a * x + b)
  error = np.sqrt(np.sum(residuals ** 2) / max(len(x) - 2, 1) /
                  np.sum((x - x.mean()) ** 2))
  return float(a), float(error)


def soak(workdir: str, minutes: float, flags: tuple[str, ...]
         ) -> tuple[list[Sample], dict[str, int], int, list[str]]:
  """Runs looper for `minutes`, then SIGTERM; (a sample per loop, counts
  of evaluations and saves, the exit code, the last lines of stderr)."""
  proc = popen_looper(*ARGS, *flags, f"--workdir={workdir}")
  start = time.monotonic()
  # The stop, and a kill if the stop does not end it in 5 minutes.
  timers = [threading.Timer(60 * minutes, proc.send_signal, (signal.SIGTERM,)),
            threading.Timer(60 * minutes + 300, proc.kill)]
  for timer in timers:
    timer.start()
  samples, counts = [], collections.Counter()
  tail = collections.deque(maxlen=20)
  try:
    for line in proc.stderr:
      tail.append(line.rstrip())
      counts["evaluations"] += " eval at step " in line
      counts["saves"] += " Saved " in line
      match = PROGRESS.search(line)
      if match:
        now = sample(proc.pid, time.monotonic() - start, int(match.group(1)))
        if now is not None:
          samples.append(now)
    code = proc.wait(timeout=60)
  finally:
    for timer in timers:
      timer.cancel()
    proc.kill()
    proc.wait()
  return samples, dict(counts), code, list(tail)


def report(samples: list[Sample], warmup: float) -> tuple[float, str]:
  """(the slope after the warm-up, the lines that describe the soak)."""
  first = max(int(len(samples) * warmup), 1)
  kept = samples[first - 1:]
  per_loop, error = slope(kept)
  mb = lambda s: f"{s.rss_kb / 1024:.1f} MB"
  start, warm, end = samples[0], kept[0], samples[-1]
  tenths = [samples[min(len(samples) - 1, len(samples) * i // 10)]
            for i in range(11)]
  # A pool that grows by doubling regions and never gives them back
  # (TensorFlow's oneDNN CPU allocator) shows as steps, not as a slope:
  # they are listed, and the growth between them is given apart.
  steps = [(i + 2, b.rss_kb - a.rss_kb)
           for i, (a, b) in enumerate(zip(samples, samples[1:]))
           if b.rss_kb - a.rss_kb >= 4096]
  between = (end.rss_kb - warm.rss_kb -
             sum(kb for loop, kb in steps if loop > first)) / len(kept)
  lines = [
      f"loops: {len(samples)}, steps: {end.step} in {end.seconds / 60:.1f}"
      f" min ({end.step / end.seconds:.0f} steps/s)",
      f"RSS: {mb(start)} at loop 1, {mb(warm)} at loop {first} (warm-up"
      f" end, {warm.seconds:.0f} s), {mb(end)} at loop {len(samples)}",
      f"slope after warm-up: {per_loop:+.2f} +- {error:.2f} KB per loop"
      f" ({per_loop * len(samples) / max(end.seconds, 1e-9) * 60 / 1024:+.3f}"
      f" MB per minute); {between:+.2f} KB per loop between the steps",
      f"threads: {start.threads} -> {end.threads}, open fds: {start.fds} ->"
      f" {end.fds}",
      "RSS by tenths of the run (MB): " +
      " ".join(f"{s.rss_kb / 1024:.1f}" for s in tenths),
      "slope by quarters after warm-up (KB per loop): " +
      ", ".join("{:+.2f} +- {:.2f}".format(*slope(quarter))
                for quarter in np.array_split(np.array(kept, object), 4)),
      "steps of >= 4 MB from one loop to the next: " +
      (", ".join(f"+{kb / 1024:.0f} MB at loop {loop}" for loop, kb in steps)
       or "none")]
  return per_loop, "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--minutes", type=float, default=5.0)
  parser.add_argument("--warmup", type=float, default=0.2,
                      help="the share of the loops left out of the slope")
  parser.add_argument("--max_slope", type=float, default=None,
                      help="KB per loop above which the soak fails")
  parser.add_argument("--flags", default="",
                      help="more looper flags, space-separated")
  args = parser.parse_args(argv)
  workdir = tempfile.mkdtemp(prefix="looper-soak-")
  try:
    samples, counts, code, tail = soak(workdir, args.minutes,
                                       tuple(args.flags.split()))
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  if code != 0 or len(samples) < 10:
    print(f"the run exited {code} after {len(samples)} loops:",
          *tail, sep="\n")
    return 1
  per_loop, text = report(samples, args.warmup)
  print(text)
  print(f"evaluations: {counts.get('evaluations', 0)}, checkpoint saves:"
        f" {counts.get('saves', 0)}")
  if args.max_slope is not None and per_loop > args.max_slope:
    print(f"FAIL: {per_loop:.2f} KB per loop > --max_slope={args.max_slope}")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
