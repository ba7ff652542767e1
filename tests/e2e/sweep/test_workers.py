"""The sweep's own work, with stub trials (tests/fixtures/sweep_stub.py):
its memory over 50 trials, no TensorFlow in its process, failed trials,
an objective no run writes, Slurm's signal and end time, and two workers
sharing one study on a journal file and on PostgreSQL; and the default
starter's prepared process (looper.sweep.warm), made at the module's start
so that its TensorFlow import overlaps the stub sweeps."""

import datetime
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from looper import main
from looper.sweep import warm
import optuna
import pytest

from tests.fixtures import catalogue
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.postgres import postgres  # pylint: disable=unused-import

pytestmark = pytest.mark.slow  # processes
STUBS = "--starter=tests.fixtures.sweeps:Stubs"


@pytest.fixture(scope="module", autouse=True)
def prepared():
  """A warm starter with one process prepared (importing TensorFlow), and
  the environment it was prepared with (os.environ changes per test)."""
  starter, env = warm.Warm(), _env()
  starter.prepare(env=env)
  yield starter, env
  starter.close()


def _argv(workdir, *args):
  # A fresh interpreter, as a user's shell starts it (not a fork of the
  # suite's server, which imported TensorFlow).
  return [sys.executable, "-m", "looper.cli.sweep", "--config=unused.py",
          f"--workdir={workdir}", STUBS, *args]


def _env(**more):
  return dict(os.environ, **{"PYTHONPATH": PYTHONPATH, **more})


def _said(stdout: str) -> str:
  """The sweep's lines without their time ('12:00:01 looper sweep: ...')."""
  return "\n".join(l.split(" ", 1)[-1] for l in stdout.splitlines())


def _lines(folder, name="metrics.jsonl"):
  return [json.loads(l) for l in
          (pathlib.Path(folder) / name).read_text().splitlines()]


def test_fifty_trials_in_flat_memory_without_tensorflow(tmp_path):
  # PYTHONPATH without the suite's startup folder: with matplotlib (the
  # sweep extra's), for the plots.
  done = subprocess.run(_argv(tmp_path / "s", "--trials=50", "--parallel=2",
                              "--seed=0", "--pruner=none",
                              "--max_failures=50", "--sampler=random"),
                        cwd=ROOT, env=_env(PYTHONPATH=str(ROOT)),
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  plots = sorted((tmp_path / "s" / "plots").iterdir())
  assert [p.name for p in plots] == [
      "optimization_history.png", "parallel_coordinate.png",
      "param_importances.png"]
  assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
  study = optuna.load_study(study_name="s",
                            storage=f"sqlite:///{tmp_path}/s/study.db")
  trials = study.get_trials()
  assert len(trials) == 50
  rss = {}
  for t in trials:
    folder = tmp_path / "s" / "trials" / str(t.number)
    if t.state.name == "FAIL":  # width 1: one line, and the sweep went on
      assert t.user_attrs["error"] == (
          "--config.model.width=1: the stub refuses it")
      continue
    assert t.state.name == "COMPLETE"
    lines = _lines(folder)
    assert not any(l["parent_tf"] for l in lines)
    rss[t.number] = lines[0]["parent_rss"]
  settled = [v for n, v in rss.items() if n >= 10]
  # kB: what 40 more trials add to the parent's resident memory.
  assert max(settled) - min(settled) < 8_000, rss


def test_failed_trials_in_a_row_stop_the_sweep_in_one_line(tmp_path):
  done = subprocess.run(_argv(tmp_path / "s", "--trials=5",
                              "--max_failures=2", "--seed=0"),
                        cwd=ROOT, env=_env(LOOPER_STUB_FAIL="1"),
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 1
  study = optuna.load_study(study_name="s",
                            storage=f"sqlite:///{tmp_path}/s/study.db")
  trials = study.get_trials()
  assert [t.state.name for t in trials] == ["FAIL", "FAIL"]
  errors = [t.user_attrs["error"] for t in trials]  # each trial's own line
  assert all(re.fullmatch(r"--config\.model\.width=\d+: the stub refuses it",
                          e) for e in errors), errors
  said = _said(done.stdout)
  for t, error in zip(trials, errors):
    assert len(catalogue.found("sweep-trial-failed", said, number=t.number,
                               **{"the trial's own line": error})) == 1
  assert len(catalogue.found("sweep-failures-in-a-row", said, count=2,
                             number=1, **{"its line": errors[1]})) == 1


def test_an_objective_no_run_writes_stops_before_a_second_trial(tmp_path):
  done = subprocess.run(_argv(tmp_path / "s", "--trials=4", "--parallel=2",
                              "--seed=0"),  # trial 0: width 5, no failure
                        cwd=ROOT, env=_env(LOOPER_STUB_OBJECTIVE="eval/typo",
                                           LOOPER_STUB_SECS="30"),
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 1
  assert len(catalogue.found(
      "sweep-objective-not-written", _said(done.stdout), objective="eval/typo",
      number=0, keys="accuracy, parent_rss, parent_tf")) == 1
  # With 2 slots, no second trial started meanwhile.
  assert sorted(os.listdir(tmp_path / "s" / "trials")) == ["0"]


def _slurm_env(tmp_path, end: str):
  """A Slurm job 42 whose squeue says it ends at `end` and whose scontrol
  writes what it was asked to tmp_path/scontrol."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for name, body in (("squeue", f"echo '{end}'"),
                     ("scontrol", f'echo "$@" >> {tmp_path}/scontrol')):
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)
  return _env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
              SLURM_JOB_ID="42", LOOPER_STUB_SECS="60")


def _reported(storage: str) -> bool:
  """Whether the study's trial 0 has an evaluation reported."""
  try:
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
  except KeyError:  # no study yet
    return False
  return bool(trials and trials[0].intermediate_values)


def _wait(predicate, proc):
  while not predicate():
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.05)


def test_slurm_s_signal_or_end_time_saves_the_trial_and_requeues(tmp_path):
  """--slurm_margin_secs and the job's end time (squeue), or SIGUSR1
  (#SBATCH --signal=B:USR1@120), stop the worker: its trial gets SIGTERM
  (it saves) and stays RUNNING, and the job is requeued; the rerun resumes
  the trial, its reported steps not sent twice."""
  args = _argv(tmp_path / "s", "--trials=1", "--seed=0", "--pruner=none")
  folder = tmp_path / "s" / "trials" / "0"
  # 1: the job ends in 30 s, the margin is 60: no trial starts.
  end = (datetime.datetime.now() + datetime.timedelta(seconds=30)).isoformat(
      timespec="seconds")
  env = _slurm_env(tmp_path, end)
  first = subprocess.run([*args, "--slurm_margin_secs=60"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120,
                         check=False)
  assert first.returncode == 0, first.stderr[-2000:]
  assert "the Slurm job ends in under --slurm_margin_secs" in first.stdout
  assert not folder.exists()
  # 2: SIGUSR1 once the trial's first evaluation was reported.
  storage = f"sqlite:///{tmp_path}/s/study.db"
  second = subprocess.Popen(args, cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  _wait(lambda: _reported(storage), second)
  second.send_signal(signal.SIGUSR1)
  assert second.wait(timeout=60) == 0
  assert (tmp_path / "scontrol").read_text().splitlines() == [
      "requeue 42", "requeue 42"]
  [trial] = optuna.load_study(study_name="s", storage=storage).get_trials()
  assert trial.state.name == "RUNNING"
  assert list(trial.intermediate_values) == [10]
  # 3: to its end.
  done = subprocess.run(args, cwd=ROOT, env=dict(env, LOOPER_STUB_SECS="0"),
                        capture_output=True, text=True, timeout=120,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  [trial] = optuna.load_study(study_name="s", storage=storage).get_trials()
  assert trial.state.name == "COMPLETE"
  assert sorted(trial.intermediate_values) == [10, 20, 30]
  assert len((folder / "runs.log").read_text().split()) == 2


@pytest.mark.parametrize("storage", ["journal", "postgresql"])
def test_two_workers_share_one_study(tmp_path, storage, request):
  url = (str(tmp_path / "s.journal") if storage == "journal" else
         request.getfixturevalue("postgres"))
  args = _argv(tmp_path / "s", "--trials=6", "--seed=0", "--pruner=none",
               f"--storage={url}", "--study=shared")
  env = _env(LOOPER_STUB_SECS="0.3")
  workers = [subprocess.Popen(args, cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
  outs = [w.communicate(timeout=300) for w in workers]
  assert [w.returncode for w in workers] == [0, 0], outs
  started = [{l.split("trial ")[1].split(" ")[0] for l in out.splitlines()
              if " (model.width=" in l} for out, _ in outs]
  assert started[0] and started[1] and not started[0] & started[1]
  assert sorted(map(int, started[0] | started[1])) == list(range(6))
  for n in range(6):  # every trial ran once, none twice
    runs = (tmp_path / "s" / "trials" / str(n) / "runs.log").read_text()
    assert len(runs.split()) == 1
  storage_ = (optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(url))
              if storage == "journal" else url.replace(
                  "postgresql://", "postgresql+psycopg://"))
  study = optuna.load_study(study_name="shared", storage=storage_)
  assert len(study.get_trials()) == 6


def test_a_prepared_process_runs_the_trial_handed_over(prepared, tmp_path):
  """Made at the module's start (`prepared`): it runs the trial handed to
  it as `python -m looper.main` would; anything else starts afresh, and
  the unused prepared process ends."""
  prepared, env = prepared
  [ready] = prepared.ready.values()
  log = str(tmp_path / "trial.log")
  proc = prepared.start([sys.executable, "-m", "looper.main", "--help"],
                        env=env, stdout=log, stderr=log)
  assert proc is ready and not prepared.ready
  assert proc.wait(timeout=120) == 0
  assert pathlib.Path(log).read_text() == main.USAGE + "\n"
  # Not looper.main: a fresh process, and the prepared one ended.
  prepared.prepare(env=env)
  [unused] = prepared.ready.values()
  other = prepared.start([sys.executable, "-c", "print('fresh')"], env=env,
                         stdout=log, stderr=log)
  assert other is not unused and other.wait(timeout=60) == 0
  assert unused.poll() is not None
  prepared.prepare(env=env)
  [left] = prepared.ready.values()
  prepared.close()
  assert left.poll() is not None and not prepared.ready
