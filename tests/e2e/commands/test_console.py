"""What a user sees: the first screen, the closing summary, describe, help;
the same lines from plain Python (a notebook), or none if asked.

A process where the process is what is seen (a first screen free of
TensorFlow's start-up lines, absl's logging, logical CPUs, a notebook's
unset logging); the rest (a resumed run's lines, `--help`'s text) from the
same code in this process. The first screen, `--verbosity=1` and the
start-up's share of goodput are a user's `looper` in a new interpreter
(the fresh lane: processes.run_fresh).
"""

import json
import logging
import os
import re
import sys

import pytest

from looper import main
from looper import run
from looper import workdir as workdir_lib
from looper.cli import runs
from looper.measure import goodput
from looper.measure import peak_flops
from tests.fixtures import forks
from tests.fixtures import tiny
from tests.fixtures.configs import configured, run_here
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import (LOOPBACK_ENV, TENSORFLOW_CHATTER,
                                      TENSORFLOW_LOG_LINE, fresh_env,
                                      run_fresh, run_ok)

# Subprocesses (own strategies, workers): the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

TIME = r"\d\d:\d\d:\d\d"
NUMBER = r"\d(?:\.\d+)?(?:e-\d+)?"  # a figure from 0 to 10


def column_ends(line: str) -> list[int]:
  """Where each word of `line` ends: right-aligned columns end alike."""
  return [m.end() for m in re.finditer(r"\S+", line)]


def test_first_screen_header_progress_and_summary(tmp_path, caplog):
  workdir = tmp_path / "run"
  args = ("--config=tests/fixtures/tiny.py", f"--workdir={workdir}",
          "--config.checkpoint.best_metric=accuracy",
          "--config.export.at_end=True", "--config.train.grad_norm=True")
  proc = run_fresh("train_and_eval", *args, "--config.train.steps=20")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not proc.stdout  # absl's handler shows the lines: on stderr, once
  lines = proc.stderr.splitlines()
  assert not [l for l in lines if any(c in l for c in TENSORFLOW_CHATTER)
             ], lines[:5]
  assert re.fullmatch(
      rf"{TIME} looper train_and_eval: sequential \(212 parameters\) in"
      rf" {workdir} \(fresh start\)", lines[0]), lines[0]
  assert lines[1:6] == [
      "  strategy   default, 1 replica (default device)",
      "  batch      32 global = 32 per replica x 1; eval 64",
      "  steps      20, 10 per loop; eval every 20, checkpoint every 20",
      "  precision  float32",
      # SGD's momentum of 212 float32 weights, and its int64 step count.
      "  memory     optimizer state 856 B per device"]
  # The peak MFU is of: the probes' figure, measured or cached in the
  # session's cache (test_peak_flops).
  assert re.fullmatch(
      r"  MFU        of [\d.]+ \w?FLOP/s: the measured float32 matmul peak of"
      r" this CPU's \d+ cores: (the best of .+, )?a (probe|loop) \(.+ UTC\);"
      r" cached in " + re.escape(peak_flops.cache_path()), lines[6]), lines[6]
  # 8 -> 16 -> 4, batch 32: 192 multiply-adds forward, 192 for the weights'
  # gradients, 64 for the hidden layer's (none for the inputs'), x 2.
  assert re.fullmatch(rf"{TIME} FLOPs per train step: 2.867e\+04 \(counted"
                      r" once from its graph: .*\)", lines[7]), lines[7]
  # The train rows: a legend, the header row, a row per loop, each figure
  # right-aligned under its name; the gradient's norm asked for is in
  # TensorBoard and at --verbosity=1, not on them.
  assert lines[8][9:] == ("train rows: means over each loop's steps (not"
                          " running means); lr at the loop's end; more with"
                          " --verbosity=1")
  heading, rows = lines[9], [l for l in lines if " train step " in l]
  assert heading.split()[1:] == ["loss", "accuracy", "lr", "steps/s", "ETA"]
  assert [l.split()[3] for l in rows] == ["10/20", "20/20"]
  for row in rows:
    assert column_ends(row)[4:] == column_ends(heading)[1:], (heading, row)
    assert re.fullmatch(rf"{TIME} train step \d+/20 +{NUMBER} +{NUMBER}"
                        rf" +1\.000e-1 +[\d.]+k? +0:00:\d\d", row), row
  assert not [l for l in lines if "grad_norm" in l]
  assert max(len(l) for l in lines if re.match(rf"{TIME} (train|eval) ", l)
             ) <= 120
  done = next(i for i, l in enumerate(lines) if " looper done: " in l)
  took = re.fullmatch(rf"{TIME} looper done: step 20 in (0:00:\d\d) \(this"
                      r" attempt's wall time\)", lines[done])
  assert took, lines[done]
  # `looper runs` shows the same time: the one attempt's record; a user's
  # `looper runs` (it imports TensorFlow) prints its table, quietly too.
  assert runs.summarize(str(workdir))[runs.WALL] == took.group(1)
  # Every column: a temporary path makes the table wider than 120.
  table = run_fresh("runs", str(workdir), "--columns=all")
  assert table.returncode == 0 and took.group(1) in table.stdout, table
  assert not [l for l in table.stderr.splitlines()
              if any(c in l for c in TENSORFLOW_CHATTER)], table.stderr
  last = re.fullmatch(rf"  last eval   loss +{NUMBER}  accuracy +({NUMBER})"
                      r"  examples +1001", lines[done + 1])
  assert last and lines[done + 2] == (
      f"  best eval   accuracy {last.group(1)} at step 20")
  # The goodput line is the one attempt's record, read back.
  totals = goodput.Totals.of(goodput.read(workdir_lib.Workdir(str(workdir))))
  assert totals.attempts == 1
  assert lines[done + 3:] == [
      f"  checkpoint  {workdir}/checkpoints/ckpt-20",
      f"  events      {workdir}/train, {workdir}/eval",
      f"  export      {workdir}/export/20",
      f"  goodput     {totals.line()}",
      f"  tensorboard --logdir={workdir}"]

  # Resumed (in this process: the lines are the same run's).
  with caplog.at_level(logging.INFO):
    run_here(*args, "--config.train.steps=30")
  resumed = "\n".join(r.getMessage() for r in caplog.records).splitlines()
  [header] = [l for l in resumed if l.startswith("looper train_and_eval: ")]
  assert header.endswith(
      f"in {workdir} (resumed from {workdir}/checkpoints/ckpt-20)"), header
  # Two attempts: the goodput line's total, which the table shows.
  [both] = [l for l in resumed if l.startswith("  goodput     ")]
  assert f" of {runs.summarize(str(workdir))[runs.WALL]} in 2 attempts " in both


def test_verbose_logs_show_tensorflows_start_counted_in_goodput(tmp_path):
  """--verbosity=1 keeps TensorFlow's start-up lines and absl's own long
  ones, and adds a detail line under each train row; the attempt's
  start-up (goodput) holds the TensorFlow import this process made (-X
  importtime: only a fresh process makes it)."""
  proc = run_fresh("train", "--config=tests/fixtures/tiny.py",
                   f"--workdir={tmp_path}", "--config.train.steps=10",
                   "--verbosity=1", env=fresh_env(PYTHONPROFILEIMPORTTIME="1"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert re.search(TENSORFLOW_LOG_LINE, proc.stderr, re.M), proc.stderr[:3000]
  assert re.search(r"^[IWE]\d{4} \d\d:\d\d:\d\d", proc.stderr, re.M)
  # Under each train row, the rest of its loop's figures.
  assert re.search(r"\] +detail  [\d.]+k? examples/s, [\d.]+ \w?FLOP/s = .*"
                   r" weight_norm +\S+\s+update_ratio", proc.stderr), (
                       proc.stderr[-3000:])
  # 'import time: <self us> | <cumulative us> | tensorflow', once.
  [imported] = re.findall(r"^import time:\s+\d+ \|\s+(\d+) \| tensorflow$",
                          proc.stderr, re.M)
  [record] = goodput.read(workdir_lib.Workdir(str(tmp_path)))
  assert record["seconds"]["startup"] >= int(imported) / 1e6, (
      record["seconds"], imported)


def test_describe_a_mirrored_four_device_config():
  proc = run_ok("describe", "--config=tests/fixtures/tiny.py",
                "--config.distribution.num_cpu_devices=4")
  out = proc.stdout
  assert out.startswith("looper describe: sequential (212 parameters)\n"
                        "  strategy   Mirrored, 4 replicas (4 CPU)\n"
                        "  batch      32 global = 8 per replica x 4; eval 64\n")
  for expected in (
      "  data.train_split='train': 1,001 examples, element mode; inputs"
      " float32[8], labels int32[]",
      "dense_1 (Dense)", "Total params: 212", '"num_cpu_devices": 4'):
    assert expected in out, expected


def test_help_lists_the_modes_and_experiments(monkeypatch, capsys):
  # What `python -m looper.main --help` and `looper --help` run.
  monkeypatch.setattr(sys, "argv", ["looper", "--help"])
  with pytest.raises(SystemExit) as e:
    main.cli()
  assert e.value.code == 0
  out = capsys.readouterr().out
  for mode in ("train_and_eval", "eval", "export", "check", "describe",
               "launch", "runs"):
    assert re.search(rf"^  {mode} ", out, re.M), mode
  assert "experiments/*.py" in out


# What a notebook cell runs: no absl app, no logging set up.
_NOTEBOOK = """
import json, sys
from looper import run
from tests.fixtures import tiny
config = tiny.get_config()
config.train.steps = 20
shown = run.run(config, sys.argv[1])
print("-- quiet --")
run.run(config, sys.argv[2], verbose=False)
print(json.dumps(shown["eval"]))
"""


def test_plain_python_prints_the_run_unless_asked_not_to(tmp_path):
  proc = forks.run(
      [sys.executable, "-c", _NOTEBOOK, str(tmp_path / "a"),
       str(tmp_path / "b")], cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=PYTHONPATH, **LOOPBACK_ENV),
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  shown, quiet = proc.stdout.split("-- quiet --\n")
  lines = shown.splitlines()
  assert re.fullmatch(
      rf"{TIME} looper train_and_eval: sequential \(212 parameters\) in"
      rf" {tmp_path / 'a'} \(fresh start\)", lines[0]), lines[0]
  assert lines[1] == "  strategy   default, 1 replica (default device)"
  progress = [l for l in lines if re.match(rf"{TIME} train step ", l)]
  assert [l.split()[1:4] for l in progress] == [
      ["train", "step", "10/20"], ["train", "step", "20/20"]]
  # The eval line and the summary hold the numbers the call returned, to
  # 4 significant digits: the loss first, the examples last.
  logs = json.loads(quiet.splitlines()[-1])
  [evaluated] = [l[9:] for l in lines if " eval at step " in l]
  head, figures = evaluated.split(": ", 1)
  shown = dict(zip(figures.split()[::2], map(float, figures.split()[1::2])))
  assert head == "eval at step 20" and list(shown) == [
      "loss", *[k for k in logs if k not in ("loss", "examples")], "examples"]
  assert shown == pytest.approx(logs, rel=5e-4)
  done = next(i for i, l in enumerate(lines) if " looper done: " in l)
  assert lines[done + 1] == f"  last eval   {figures}"
  assert lines[-1] == f"  tensorboard --logdir={tmp_path / 'a'}"
  # Quiet: nothing but the result; and no line went to stderr either.
  assert quiet.splitlines() == [quiet.splitlines()[-1]]
  assert not [l for l in proc.stderr.splitlines()
              if re.match(rf"{TIME} ", l) or "looper" in l], proc.stderr


def header_of(mode, caplog, *args) -> list[str]:
  """The header's lines `run.run(*args)` logs."""
  caplog.clear()
  with caplog.at_level(logging.INFO):
    run.run(*args)
  [header] = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith(f"looper {mode}: ")]
  return header.splitlines()


def test_eval_and_export_describe_the_run_they_read(tmp_path, caplog,
                                                    monkeypatch):
  """In-process: a run of 10 steps, read with another config (tiny's 40
  steps, a checkpoint every 20), from Python; then as from a command line
  that sets two fields and epochs: each difference says where its value
  came from (the flags, the experiment file, or derived from epochs)."""
  run.run(configured(tiny.get_config(), train__steps=10,
                     checkpoint__every_steps=5), str(tmp_path), "train")
  monkeypatch.setattr(sys, "argv", ["python"])  # no command line
  differs = ("  differs    in the config given: checkpoint.every_steps=20"
             " (config.json: 5), train.steps=40 (config.json: 10)")
  for mode, path, reads in [
      ("eval", str(tmp_path / "checkpoints" / "ckpt-5"),
       f"evaluates {tmp_path}/checkpoints/ckpt-5"),
      ("export", None, "exports the latest checkpoint")]:
    header = header_of(mode, caplog, tiny.get_config(), str(tmp_path), mode,
                       path)
    # Keras numbers the models of one process: sequential_1, ...
    assert [re.sub(r"sequential_\d+", "sequential", l) for l in header] == [
        f"looper {mode}: sequential (212 parameters) in {tmp_path} ({reads})",
        "  strategy   default, 1 replica (default device)",
        "  batch      32 global = 32 per replica x 1; eval 64",
        "  steps      10, 10 per loop; eval every 20, checkpoint every 5",
        "  precision  float32",
        "  memory     optimizer state 856 B per device",
        differs]
  flags = ["--config.eval.batch_size=32", "--config.train.steps=0",
           "--config.train.epochs=0.25"]
  monkeypatch.setattr(sys, "argv", ["looper", "--mode=export",
                                    "--config=tests/fixtures/tiny.py",
                                    f"--workdir={tmp_path}", *flags])
  config = configured(tiny.get_config(), eval__batch_size=32,
                      train__steps=0, train__epochs=0.25)
  assert header_of("export", caplog, config, str(tmp_path), "export")[-1] == (
      "  differs    on the command line: eval.batch_size=32 (config.json:"
      " 64), train.epochs=0.25 (config.json: 0.0); from the experiment file:"
      " checkpoint.every_steps=20 (config.json: 5); derived: train.steps=8"
      " (config.json: 10)")
