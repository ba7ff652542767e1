"""The sweep's own work, with stub trials (tests/fixtures/sweep_stub.py):
its memory over 50 trials, no TensorFlow in its process, failed trials,
and two workers sharing one study on a journal file and on PostgreSQL."""

import json
import os
import pathlib
import subprocess
import sys

import optuna
import pytest

from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.postgres import postgres  # pylint: disable=unused-import

pytestmark = pytest.mark.slow  # processes
STUBS = "--starter=tests.fixtures.sweeps:Stubs"


def _argv(workdir, *args):
  # A fresh interpreter, as a user's shell starts it (not a fork of the
  # suite's server, which imported TensorFlow).
  return [sys.executable, "-m", "looper.cli.sweep", "--config=unused.py",
          f"--workdir={workdir}", STUBS, *args]


def _env(**more):
  return dict(os.environ, **{"PYTHONPATH": PYTHONPATH, **more})


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
  last = [l for l in done.stdout.splitlines() if "in a row" in l]
  assert len(last) == 1 and last[0].split(" ", 1)[1].startswith(
      "looper sweep: 2 trials failed in a row, the last (trial 1):"
      " --config.model.width=")
  assert last[0].endswith(": the stub refuses it; fix that, or raise"
                          " --max_failures")
  study = optuna.load_study(study_name="s",
                            storage=f"sqlite:///{tmp_path}/s/study.db")
  assert [t.state.name for t in study.get_trials()] == ["FAIL", "FAIL"]


@pytest.mark.parametrize("storage", ["journal", "postgresql"])
def test_two_workers_share_one_study(tmp_path, storage, request):
  url = (str(tmp_path / "s.journal") if storage == "journal" else
         request.getfixturevalue("postgres"))
  args = _argv(tmp_path / "s", "--trials=12", "--seed=0", "--pruner=none",
               f"--storage={url}", "--study=shared")
  env = _env(LOOPER_STUB_SECS="0.4")
  workers = [subprocess.Popen(args, cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
  outs = [w.communicate(timeout=300) for w in workers]
  assert [w.returncode for w in workers] == [0, 0], outs
  started = [{l.split("trial ")[1].split(" ")[0] for l in out.splitlines()
              if " (model.width=" in l} for out, _ in outs]
  assert started[0] and started[1] and not started[0] & started[1]
  assert sorted(map(int, started[0] | started[1])) == list(range(12))
  for n in range(12):  # every trial ran once, none twice
    runs = (tmp_path / "s" / "trials" / str(n) / "runs.log").read_text()
    assert len(runs.split()) == 1
  storage_ = (optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(url))
              if storage == "journal" else url.replace(
                  "postgresql://", "postgresql+psycopg://"))
  study = optuna.load_study(study_name="shared", storage=storage_)
  assert len(study.get_trials()) == 12
