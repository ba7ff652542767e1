"""Goodput: each attempt's time split, across a kill -9 and a resume.

The ledger's arithmetic against hand-computed splits (a fake clock); a real
run killed with SIGKILL and resumed, whose second attempt must count the
steps the first trained past its last checkpoint as recomputed; the
preemption (SIGTERM) case is in test_faults and test_vm_notices
(stopping.stop_and_resume).
"""

import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from looper import workdir as workdir_lib
from looper.cli import runs
from looper.measure import goodput
from tests.fixtures.configs import run_here
from tests.fixtures.events import scalars
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import popen_looper


class Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_an_attempt_killed_after_its_checkpoint_and_the_one_that_resumes(
    tmp_path):
  wd = workdir_lib.Workdir(str(tmp_path))
  clock = Clock()
  first = goodput.Ledger(wd, started=clock.now, clock=clock)
  clock.now += 2.0
  first.start(0)  # 2 s of start-up
  # The first loop: 0.5 s compiling, then 0.01 s a step, like the others.
  first.loop(1, 100, 1.5)
  for step in (101, 201, 301):
    first.loop(step, 100, 1.0)
  first.add("eval", 0.5)
  first.add("checkpoint", 0.25)
  first.add("progress", 0.125)  # not a category: stays in 'other'
  clock.now += 6.0
  assert first.write() is not None
  assert first.write() is None  # within WRITE_SECS of the last
  # ...killed here, at step 400, its last checkpoint at 300: never closed.
  (killed,) = goodput.read(wd)
  assert killed["attempt"] == 1 and killed["ended"] == goodput.RUNNING
  assert (killed["first_step"], killed["reached"], killed["steps"]) == (
      0, 400, 400)
  assert killed["wall"] == 8.0
  assert killed["seconds"] == pytest.approx(dict(
      productive=4.0, startup=2.0, compile=0.5, recomputed=0.0,
      input_wait=0.0, eval=0.5, checkpoint=0.25, other=0.75))

  clock.now += 100.0  # the scheduler's restart: nobody's time
  second = goodput.Ledger(wd, started=clock.now, clock=clock)
  clock.now += 1.0
  second.start(300)
  # Steps 301-400 again and 401-500 new in the first loop (a quarter of it
  # waiting for data), then new ones.
  second.loop(301, 200, 4.0, input_wait=0.25)
  second.loop(501, 100, 1.0)
  clock.now += 6.0
  totals = second.close("finished")
  records = goodput.read(wd)
  assert [r["attempt"] for r in records] == [1, 2]
  resumed = records[1]
  assert resumed["ended"] == "finished"
  assert (resumed["first_step"], resumed["reached"], resumed["steps"],
          resumed["recomputed_steps"]) == (300, 600, 200, 100)
  # Compile: 3 s not waiting - 200 steps x 0.01 s = 1 s, half of it out of
  # the recomputed steps' share (1.5 s), half out of the new ones'.
  assert resumed["seconds"] == pytest.approx(dict(
      productive=2.0, startup=1.0, compile=1.0, recomputed=1.0,
      input_wait=1.0, eval=0.0, checkpoint=0.0, other=1.0))
  for record in records:
    assert sum(record["seconds"].values()) == pytest.approx(record["wall"])
  assert totals == goodput.Totals.of(records)
  assert totals.goodput == pytest.approx(6.0 / 15.0)
  assert totals.largest == ("startup", pytest.approx(3.0 / 15.0))
  assert totals.line() == (
      "40% of 0:00:15 in 2 attempts (largest loss: startup, 20%)")


def test_steps_redone_after_a_nan_roll_back_are_recomputed(tmp_path):
  clock = Clock()
  ledger = goodput.Ledger(workdir_lib.Workdir(str(tmp_path)),
                          started=clock.now, clock=clock)
  ledger.start(0)
  ledger.loop(1, 100, 1.0)
  ledger.loop(101, 100, 1.0)  # blew up; rolled back to the save at 100
  ledger.loop(101, 100, 1.0)
  ledger.loop(201, 50, 0.5)
  clock.now += 3.5
  ledger.close("finished")
  (record,) = goodput.read(workdir_lib.Workdir(str(tmp_path)))
  assert (record["steps"], record["recomputed_steps"]) == (250, 100)
  assert record["seconds"]["recomputed"] == pytest.approx(1.0)
  assert record["seconds"]["productive"] == pytest.approx(2.5)


def test_compile_time_is_the_first_loop_beyond_its_lengths_later_rate(
    tmp_path):
  clock = Clock()
  ledger = goodput.Ledger(workdir_lib.Workdir(str(tmp_path)),
                          started=clock.now, clock=clock)
  ledger.start(0)
  ledger.loop(1, 100, 1.5)
  ledger.loop(101, 1, 0.5)  # a profiled step: not the steady rate
  ledger.loop(102, 100, 1.0)
  ledger.loop(202, 100, 1.0)
  clock.now += 4.0
  seconds = ledger.close("finished").seconds
  assert seconds["compile"] == pytest.approx(0.5)
  assert seconds["productive"] == pytest.approx(3.5)


@pytest.mark.slow  # a subprocess
def test_process_started_counts_from_the_process_start():
  # A process that sleeps a second before asking: its start-up holds it.
  age = subprocess.run(
      [sys.executable, "-c",
       "import time; time.sleep(1.0)\n"
       "from looper.measure import goodput\n"
       "print(time.monotonic() - goodput.process_started())"],
      cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
  assert 1.0 <= float(age.stdout) < 60


TINY = "--config=tests/fixtures/tiny.py"


@pytest.mark.slow  # a subprocess
def test_a_kill9_and_resume_counts_the_recomputed_steps(tmp_path):
  args = (TINY, "--config.train.steps=10000",
          "--config.train.steps_per_loop=100",
          "--config.checkpoint.every_steps=1500",
          "--config.eval.every_steps=0", f"--workdir={tmp_path}")
  wd = workdir_lib.Workdir(str(tmp_path))
  proc = popen_looper(*args, log=tmp_path.parent / "killed.log")
  try:
    # Frozen (SIGSTOP) where its record is past its last checkpoint, then
    # killed: the resumed attempt redoes the steps in between.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
      records = goodput.read(wd)
      if records and records[0]["reached"] >= 2000:
        proc.send_signal(signal.SIGSTOP)
        reached = goodput.read(wd)[0]["reached"]
        saved = tf.train.latest_checkpoint(wd.checkpoints)
        if saved and int(saved.rsplit("-", 1)[1]) < reached:
          break
        proc.send_signal(signal.SIGCONT)
      time.sleep(0.05)
    else:
      pytest.fail(f"no record past a checkpoint: {proc.log.read_text()}")
    proc.kill()
    proc.wait(timeout=60)
  finally:
    proc.kill()
  restored = int(saved.rsplit("-", 1)[1])

  run_here(*args)
  killed, resumed = goodput.read(wd)
  assert killed["ended"] == goodput.RUNNING
  assert killed["reached"] == reached
  assert resumed["ended"] == "finished"
  assert (resumed["first_step"], resumed["reached"]) == (restored, 10000)
  assert resumed["recomputed_steps"] == reached - restored > 0
  assert resumed["steps"] == 10000 - reached
  assert resumed["seconds"]["recomputed"] > 0
  for record in (killed, resumed):
    assert sum(record["seconds"].values()) == pytest.approx(record["wall"])
  totals = goodput.Totals.of([killed, resumed])
  assert 0 < totals.goodput < 1
  # The same figure in `looper runs` and, last, in TensorBoard.
  assert runs.summarize(wd.root)["goodput"] == f"{totals.goodput:.0%}"
  series = scalars(wd.train_events, "goodput/goodput")
  assert series[10000] == pytest.approx(totals.goodput, rel=1e-6)
  assert set(series) <= set(range(0, 30001, 100))
  # One trace per writer and set of names: no "retracing" warning.
  assert "retracing" not in proc.log.read_text()
