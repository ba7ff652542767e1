"""A sweep worker's reading of its Slurm job's end time (a fake squeue)."""

import datetime
import os

from looper.sweep import slurm


def _fake(tmp_path, monkeypatch, output: str) -> None:
  squeue = tmp_path / "squeue"
  squeue.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\n"
                    f"echo '{output}'\n")
  squeue.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_the_end_time_of_an_array_task(tmp_path, monkeypatch):
  _fake(tmp_path, monkeypatch, "2026-11-29T10:30:00")
  env = {"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "12",
         "SLURM_ARRAY_TASK_ID": "3"}
  assert slurm.end_time(env) == datetime.datetime(
      2026, 11, 29, 10, 30).timestamp()
  assert (tmp_path / "args").read_text().split() == ["-h", "-j", "12_3",
                                                     "-o", "%e"]


def test_no_limit_or_no_job_is_no_end_time(tmp_path, monkeypatch):
  _fake(tmp_path, monkeypatch, "UNLIMITED")
  assert slurm.end_time({"SLURM_JOB_ID": "17"}) is None
  assert slurm.end_time({}) is None
  assert not slurm.requeue({})
