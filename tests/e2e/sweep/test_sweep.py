"""`looper sweep` end to end: a real study of tiny runs, killed and resumed.

One seeded sweep of 6 tiny trials (SQLite, --parallel=1, the median
pruner after 2 trials, 20 steps evaluated every 5) runs uninterrupted: the
twin, whose trials are also read back as TensorBoard's HParams rows and
`looper runs` shows. A second sweep of the same seed is killed at three
moments (kill -9 of a trial's process, of
the parent just after it claimed trial 1, of the parent and its trials
mid-trial, as a lost machine) and rerun with the same command each time:
its trials equal the twin's first three, per step and in their weights.
The sweep's own work (memory over 50 trials, no TensorFlow in the parent,
failures in a row, an objective no run writes, Slurm's signal) is checked
with stub trials (test_workers.py).
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import optuna
import pytest

from looper.cli import runs
from looper.sweep import trials as trials_lib
from tests.fixtures import catalogue
from tests.fixtures import forks
from tests.fixtures import killer
from tests.fixtures import sweeps
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.events import curve, hparams_row
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV

pytestmark = pytest.mark.slow  # trials are processes
ARGS = ("--seed=1", "--pruner_startup_trials=2")


def _study(workdir) -> optuna.Study:
  return optuna.load_study(study_name=pathlib.Path(workdir).name,
                           storage=f"sqlite:///{workdir}/study.db")


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("sweep") / "s"
  assert sweeps.run_sweep(workdir, "--trials=6", *ARGS) == 0
  return workdir


def _trial(workdir, n: int) -> pathlib.Path:
  return pathlib.Path(workdir) / "trials" / str(n)


def test_a_seeded_sweep_end_to_end(twin, capsys):
  trials = _study(twin).get_trials()
  states = [t.state.name for t in trials]
  assert len(trials) == 6 and set(states) <= {"COMPLETE", "PRUNED"}
  assert "PRUNED" in states and "COMPLETE" in states
  for t in trials:
    folder = _trial(twin, t.number)
    config = json.loads((folder / "config.json").read_text())
    assert config["optimizer"]["learning_rate"] == t.params[
        "optimizer.learning_rate"]
    assert config["model"]["width"] == t.params["model.width"]
    record = json.loads((folder / "trial.json").read_text())
    assert record["state"] == t.state.name.lower()
    assert record["params"] == t.params
    steps = [json.loads(l)["step"] for l in
             (folder / "metrics.jsonl").read_text().splitlines()]
    if t.state.name == "PRUNED":  # stopped within one evaluation period
      assert max(steps) <= max(t.intermediate_values) + 5
      assert not (folder / "claim.json").exists()
    else:
      assert max(steps) == 20 and t.value == t.intermediate_values[20]
    # TensorBoard over the sweep's folder: one HParams row per trial, each
    # swept field a column of its own, first.
    values, columns = hparams_row(folder / "hparams")
    assert {k: values[k] for k in t.params} == t.params
    assert columns[:3] == [("optimizer.learning_rate", "DATA_TYPE_FLOAT64"),
                           ("model.width", "DATA_TYPE_FLOAT64"),
                           ("train.batch_size", "DATA_TYPE_FLOAT64")]
    assert "model.width=" not in values["settings"]
  best = json.loads((twin / "best.json").read_text())
  top = max((t for t in trials if t.state.name == "COMPLETE"),
            key=lambda t: t.value)
  assert (best["number"], best["value"]) == (top.number, top.value)
  assert best["command"] == (
      "looper train_and_eval --config=tests/fixtures/tiny_sweep.py"
      f" --workdir={twin}/trials/{top.number} --config.hparams_columns="
      "optimizer.learning_rate,model.width --config.optimizer.learning_"
      f"rate={top.params['optimizer.learning_rate']!r}"
      f" --config.model.width={top.params['model.width']}")
  # looper runs DIR: the trials, sorted by the objective, within 120
  # characters; what matters least left out first; --columns picks.
  def shown(*args, width=120):
    capsys.readouterr()
    assert runs.main([str(twin), *args]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert max(map(len, lines)) <= width
    return [c.strip() for c in lines[0].split("|")[1:-1]], lines[2:], err
  header, lines, err = shown()
  assert header == ["trial", "eval/accuracy", "state", "step",
                    "wall (all attempts)", "optimizer.learning_rate",
                    "model.width"] and not err
  assert [int(l.split("|")[1]) for l in lines] == [
      t.number for t in sorted(trials, key=lambda t: -t.value)]
  header, _, err = shown("--width=70", width=70)
  assert header == ["trial", "eval/accuracy", "state", "step",
                    "wall (all attempts)"]
  assert err == ("looper runs: 2 column(s) left out to fit --width=70:"
                 " optimizer.learning_rate, model.width; show them with"
                 " --columns=all or --columns=a,b\n")
  assert shown("--columns=model.width,eval/accuracy")[0] == [
      "trial", "model.width", "eval/accuracy"]


def _wait(predicate, timeout=120):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.05)


def _evaluated(folder, step) -> bool:
  try:
    return any(json.loads(l).get("step") == step and
               json.loads(l)["kind"] == "eval"
               for l in (folder / "metrics.jsonl").read_text().splitlines())
  except (OSError, ValueError):
    return False


def _claimed_process(folder) -> int | None:
  try:
    return json.loads((folder / "claim.json").read_text())["process"]
  except (OSError, ValueError, KeyError):
    return None


def _parent(workdir, log, prefix=()):
  env = dict(os.environ, PYTHONPATH=PYTHONPATH, **LOOPBACK_ENV)
  env.pop("TF_CONFIG", None)
  argv = [*(prefix or [sys.executable, "-m"]), *([] if prefix else
                                                ["looper.cli.sweep"]),
          sweeps.CONFIG, f"--workdir={workdir}", sweeps.STARTER,
          "--trials=3", *ARGS]
  with open(log, "a") as f:
    return forks.popen(argv, env=env, cwd=ROOT, stdout=f,
                       stderr=subprocess.STDOUT)


def test_killed_trials_and_parents_resume_as_the_twin(twin, tmp_path):
  workdir = tmp_path / "s"
  log = tmp_path / "parent.log"
  # 1: trial 0's process killed after its eval at step 10 (resumed in
  # place); the parent killed once it claimed trial 1, before starting it.
  first = _parent(workdir, log, killer.argv(
      "looper.sweep.claims:Claim.take", when="after", nth=2,
      module="looper.cli.sweep"))
  _wait(lambda: _evaluated(_trial(workdir, 0), 10))
  os.kill(_claimed_process(_trial(workdir, 0)), signal.SIGKILL)
  assert first.wait(timeout=120) == -signal.SIGKILL, log.read_text()
  # 2: the rerun takes trial 1 over; parent and trial killed mid-trial.
  second = _parent(workdir, log)
  _wait(lambda: _evaluated(_trial(workdir, 1), 10))
  second.kill()
  second.wait(timeout=60)
  # 3: the same command again, to the end.
  assert sweeps.run_sweep(workdir, "--trials=3", *ARGS) == 0
  text = log.read_text()
  assert "trial 0 was killed (signal 9); resuming it from its checkpoint" in (
      text)
  assert "trial 1: its worker is gone; resuming it from its checkpoint" in (
      text)
  ours, theirs = _study(workdir).get_trials(), _study(twin).get_trials()[:3]
  assert [t.params for t in ours] == [t.params for t in theirs]
  assert [t.state for t in ours] == [t.state for t in theirs]
  assert [t.intermediate_values for t in ours] == [
      t.intermediate_values for t in theirs]
  for t in ours:
    if t.state.name != "COMPLETE":
      continue
    a, b = _trial(workdir, t.number), _trial(twin, t.number)
    np.testing.assert_array_equal(curve(a / "train"), curve(b / "train"))
    ckpt_a, ckpt_b = (checkpoint_tensors(f / "checkpoints" / "ckpt-20")
                      for f in (a, b))
    assert ckpt_a.keys() == ckpt_b.keys()
    for key in ckpt_a:
      np.testing.assert_array_equal(ckpt_a[key], ckpt_b[key], err_msg=key)
  # Goodput shows the attempts of the killed trials.
  assert len(list((_trial(workdir, 0) / "goodput").iterdir())) >= 2
  assert len(list((_trial(workdir, 1) / "goodput").iterdir())) >= 2


def _error(capsys) -> str:
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def test_bad_input_is_one_line_before_the_study(twin, capsys, monkeypatch):
  assert sweeps.run_sweep(twin) == 1
  assert re.fullmatch(catalogue.line("sweep-flag-missing", flag="trials"),
                      _error(capsys))
  assert sweeps.run_sweep(twin, "--trials=0") == 1
  assert re.fullmatch(catalogue.line("sweep-count-below-one", flag="trials",
                                     value=0), _error(capsys))
  with monkeypatch.context() as m:
    m.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert sweeps.run_sweep(twin, "--trials=7", "--parallel=2") == 1
  assert re.fullmatch(catalogue.line("sweep-too-few-gpus", parallel=2,
                                     devices=1, need=2, have=1),
                      _error(capsys))
  assert sweeps.run_sweep(twin, "--trials=7", "--config.model.width=8") == 1
  assert re.fullmatch(catalogue.line("sweep-override-swept",
                                     field="model.width", value=8),
                      _error(capsys))
  assert sweeps.run_sweep(twin, "--trials=7",
                          config=f"{sweeps.CONFIG}:badkey") == 1
  assert re.fullmatch(catalogue.line("sweep-key-unknown",
                                     key="optimizer.learnig_rate",
                                     field="optimizer.learning_rate"),
                      _error(capsys))
  assert len(_study(twin).get_trials()) == 6  # the study untouched


def test_each_trial_carries_the_study_s_columns_and_group():
  """trials.study_flags: the swept fields as HParams columns, the study as
  the trackers' group when the trials track; never over the experiment's
  or the command line's own values (the spec child reads them)."""
  spec = {"space": {"optimizer.learning_rate": {}, "model.width": {}},
          "trackers": "", "trackers_group": "", "hparams_columns": ""}
  assert trials_lib.study_flags(spec, "s") == [
      "--config.hparams_columns=optimizer.learning_rate,model.width"]
  assert trials_lib.study_flags(dict(spec, trackers="mlflow,wandb"), "s") == [
      "--config.hparams_columns=optimizer.learning_rate,model.width",
      "--config.trackers_group=s"]
  assert trials_lib.study_flags(dict(spec, trackers="wandb", trackers_group="g",
                                 hparams_columns="seed"), "s") == []
