"""A sweep under a real Slurm time limit: saved, requeued, resumed exactly.

Synopsis::

    python -m tests.stress.sweep_slurm_limit      # as root, ~4 minutes

Starts the suite's one-node Slurm (tests/e2e/multiworker/test_slurm.py's
Cluster), submits README's sweep recipe as a 1-minute job (`--time=1
--requeue`) whose worker reads the job's end time and saves, stops and
requeues itself 40 s before it (`--slurm_margin_secs=40`), over 2 trials
of tests/fixtures/tiny_sweep.py long enough to span several jobs. The
same sweep runs uninterrupted outside Slurm as the twin. Prints the
requeues, each trial's state and whether its per-step loss curve and
final weights equal the twin's.
"""

import subprocess
import sys
import time

import numpy as np

from tests.e2e.multiworker.test_slurm import running_cluster, why_not
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.events import curve
from tests.fixtures.paths import ROOT

STEPS = 40000
SWEEP = ("-m", "looper.cli.sweep", "--config=tests/fixtures/tiny_sweep.py",
         "--trials=2", "--seed=1", "--pruner=none",
         f"--config.train.steps={STEPS}", "--config.train.steps_per_loop=100",
         "--config.checkpoint.every_steps=2000",
         "--config.eval.every_steps=20000")
SCRIPT = """#!/bin/bash
#SBATCH --time=1
#SBATCH --requeue
#SBATCH --open-mode=append
exec {python} {args} --workdir={workdir} --slurm_margin_secs=40
"""


def main() -> None:
  reason = why_not()
  if reason:
    sys.exit(f"sweep_slurm_limit: {reason}")
  with running_cluster() as cluster:
    root = cluster.root
    twin = root / "twin"
    subprocess.run([sys.executable, *SWEEP, f"--workdir={twin}"], cwd=ROOT,
                   env=cluster.env, check=True, capture_output=True)
    workdir, out = root / "sweep", root / "job.out"
    (root / "job.sh").write_text(SCRIPT.format(
        python=sys.executable, args=" ".join(SWEEP), workdir=workdir))
    job = cluster.run("sbatch", "--parsable", f"--output={out}",
                      str(root / "job.sh")).stdout.strip()
    start = time.monotonic()
    state = cluster.finish(job, timeout=900)
    restarts = cluster.job_state(job).get("Restarts")
    print(f"job {job}: {state} after {time.monotonic() - start:.0f} s,"
          f" {restarts} requeue(s)")
    for n in range(2):
      a, b = workdir / "trials" / str(n), twin / "trials" / str(n)
      same_curve = np.array_equal(curve(a / "train"), curve(b / "train"))
      x, y = (checkpoint_tensors(f / "checkpoints" / f"ckpt-{STEPS}")
              for f in (a, b))
      same_weights = x.keys() == y.keys() and all(
          np.array_equal(x[k], y[k]) for k in x)
      attempts = len(list((a / "goodput").iterdir()))
      print(f"trial {n}: {attempts} attempts; curve equal: {same_curve};"
            f" weights equal: {same_weights}")
    print(out.read_text()[-1500:])


if __name__ == "__main__":
  main()
