"""A sweep worker under Slurm: when its job ends, and how it requeues itself.

Synopsis::

    end = slurm.end_time()   # seconds since the epoch, or None (no job,
                             # no limit): `squeue -h -j $SLURM_JOB_ID -o %e`
    slurm.requeue()          # scontrol requeue <this job or array task>

A worker near its time limit saves its trials and requeues its job
(looper.sweep.worker); Slurm then sends SIGTERM to the job and starts it
again later, and the rerun resumes each trial from its checkpoint. The
worker learns the limit either from a signal asked for in the batch
script (`#SBATCH --signal=B:USR1@120`) or by reading the job's end time
once at its start (`--slurm_margin_secs`).
"""

import datetime
import os
import subprocess


def job_id(environ=os.environ) -> str | None:
  """This job's id for scontrol/squeue: `<array job>_<task>` for a task of
  an array job; None outside Slurm."""
  if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
    return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
  return environ.get("SLURM_JOB_ID")


def end_time(environ=os.environ) -> float | None:
  """When this job's time limit ends (module doc); None if unknown."""
  job = job_id(environ)
  if job is None:
    return None
  try:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"],
                         capture_output=True, text=True, timeout=30,
                         check=False).stdout.strip()
  except (OSError, subprocess.TimeoutExpired):
    return None
  try:  # the cluster's local time, as squeue prints it
    return datetime.datetime.fromisoformat(out.splitlines()[0]).timestamp()
  except (ValueError, IndexError):  # "N/A", "UNLIMITED", nothing
    return None


def requeue(environ=os.environ) -> bool:
  """Requeues this job (`scontrol requeue`); False outside Slurm or if
  scontrol refused (the job was not submitted with --requeue)."""
  job = job_id(environ)
  if job is None:
    return False
  done = subprocess.run(["scontrol", "requeue", job], capture_output=True,
                        text=True, timeout=60, check=False)
  return done.returncode == 0
