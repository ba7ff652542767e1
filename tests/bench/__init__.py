"""Benchmarks: commands outside the suite; their output, kept verbatim in
docs/results/, is rendered into docs/pages/benchmarks.md.

Synopsis::

    from tests import bench
    bench.header()          # first, in the parent process: what ran where
    r = bench.child("tests.bench.health", "--one=mlp,1,off")

`header` prints the lines every results file opens with (command, commit,
date, machine, CPU, software: a figure is only as good as where it was
made), `steady` is the one reading of a benchmark run's speed the
benchmarks share, `machine` the line naming the CPU, `child` a benchmark's
measurement in a fresh process.
"""

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys

import numpy as np

from tests.fixtures.events import scalars
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import LOOPBACK_ENV


def steady(train_dir: str) -> dict[str, float]:
  """Medians of a run's examples/s and input-wait fraction over its train
  loops but the first (tracing and compiling)."""
  speeds = scalars(train_dir, "examples_per_sec")
  waits = scalars(train_dir, "input_wait_fraction")
  kept = sorted(speeds)[1:]
  return dict(examples_per_sec=float(np.median([speeds[s] for s in kept])),
              input_wait=float(np.median([waits[s] for s in kept])))


def machine() -> str:
  """'N CPUs: <model name>' from /proc/cpuinfo (figures name their CPU)."""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((l.split(":", 1)[1].strip() for l in f
                    if l.startswith("model name")), "unknown")
  except OSError:
    model = "unknown"
  return f"{os.cpu_count()} CPUs: {model}"


def _commit() -> str:
  """HEAD of the tree the benchmark runs from, '+ changes' when it differs."""
  def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False).stdout.strip()
  head = git("rev-parse", "HEAD") or "unknown (not a git checkout)"
  return head + (" + uncommitted changes" if git("status", "--porcelain",
                                                  "--untracked-files=no")
                 else "")


def header() -> None:
  """Prints the '# key: value' lines a results file opens with
  (tests/tools/render_docs.py reads them back)."""
  spec = getattr(sys.modules["__main__"], "__spec__", None)
  command = ["python", "-m", spec.name] if spec else ["python", sys.argv[0]]
  versions = ", ".join(f"{p} {importlib.metadata.version(p)}"
                       for p in ("tensorflow", "keras"))
  now = datetime.datetime.now(datetime.timezone.utc)
  for key, value in (
      ("command", shlex.join([*command, *sys.argv[1:]])),
      ("commit", _commit()),
      ("date", now.strftime("%Y-%m-%d %H:%M UTC")),
      ("machine", f"{platform.system()} {platform.release()}"
                  f" {platform.machine()}"),
      ("cpu", machine()),
      ("software", f"Python {platform.python_version()}, {versions}")):
    print(f"# {key}: {value}", flush=True)


def child(module: str, *flags: str) -> dict | None:
  """Runs `python -m module flags` in a fresh process (its own TensorFlow);
  the JSON object its last stdout line holds, or None (said) if it failed."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  proc = subprocess.run(
      [sys.executable, "-m", module, *flags], cwd=ROOT, env=env,
      timeout=3600, capture_output=True, text=True, check=False)
  if proc.returncode:
    print(f"{' '.join(flags)}: failed\n{proc.stderr[-1500:]}", flush=True)
    return None
  return json.loads(proc.stdout.strip().splitlines()[-1])
