"""One writer per workdir, with real processes (looper.workdir.lease).

A second training run on a held workdir is refused in one line and writes
nothing, and the first (paused meanwhile) trains on unharmed (bit-exact
against an uninterrupted run); readers run beside a writer; a holder killed with
kill -9 does not block the rerun; a run whose lease was taken over stops at
its next save without saving. The runs that find a lease held, or take one
over, run in the test's process where that is the same (another PID on
this host).
"""

import json
import logging
import os
import re
import signal
import time

import numpy as np
import pytest

from looper import run
from looper.errors import WorkdirError
from looper.workdir import lease
from tests.fixtures import catalogue
from tests.fixtures import tiny
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.configs import configured, run_here
from tests.fixtures.events import curve
from tests.fixtures.processes import looper_lines, popen_looper
from tests.fixtures.processes import wait_for
from tests.unit.workdir.test_lease import lease_file, wd

# Subprocesses: the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

# Over a second of tiny steps after the first save (~5000 steps/s on an AMD
# EPYC): time to pause the first writer while it runs.
STEPS = 5000
ARGS = ("--config=tests/fixtures/tiny.py", f"--config.train.steps={STEPS}",
        "--config.train.steps_per_loop=50", "--config.checkpoint.every_steps=500",
        "--config.eval.every_steps=1000")


def test_a_second_writer_is_refused_and_readers_run_beside(tmp_path):
  """The second writer and the readers run in this test's own process."""
  workdir = tmp_path / "run"
  first = popen_looper(*ARGS, f"--workdir={workdir}", log=tmp_path / "first.log")
  try:
    wait_for(first.log, "Saved ")  # its folders are all there now
    # Paused while the second tries (alive, its PID holding the lease),
    # however fast this CPU would have finished it.
    first.send_signal(signal.SIGSTOP)
    held = json.loads(lease_file(workdir).read_text())
    assert held["pid"] == first.pid
    top = sorted(p.name for p in workdir.iterdir())
    config_json = (workdir / "config.json").stat().st_mtime_ns
    with pytest.raises(WorkdirError) as e:
      run.run(config(), str(workdir), mode="train")
    assert first.poll() is None, "the first run ended"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held["since"]))
    assert re.fullmatch(
        rf"--workdir={re.escape(str(workdir))} is held by another run \(host"
        rf" {re.escape(held['host'])}, pid {first.pid}, since {since}; renewed"
        r" \d+ s ago\): stop that run or choose another --workdir\. A holder"
        r" that died frees it: .*", str(e.value))
    # It wrote nothing: no new file or event file (theirs are named after
    # the writing process), no rewritten config.
    assert sorted(p.name for p in workdir.iterdir()) == top
    assert not list(workdir.rglob(f"*.{os.getpid()}.*"))
    assert (workdir / "config.json").stat().st_mtime_ns == config_json
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.log.read_text()[-3000:]
  finally:
    first.kill()
    first.wait()
  assert not lease_file(workdir).exists()  # released at the end
  # Readers beside a writer: here the writer is this process (a live PID on
  # this host), so a reader that took the lease would be refused.
  with lease.holding(wd(workdir), 60, take=True) as held:
    for mode in ("eval", "export"):
      assert run.run(config(), str(workdir), mode=mode)["step"] == STEPS
    held.check()  # still this process's
  assert not lease_file(workdir).exists()  # released at the end
  run_here(*ARGS, f"--workdir={tmp_path}/alone")
  np.testing.assert_array_equal(curve(workdir / "train"),
                                curve(tmp_path / "alone" / "train"))
  final, alone = (checkpoint_tensors(p / "checkpoints" / f"ckpt-{STEPS}")
                  for p in (workdir, tmp_path / "alone"))
  assert sorted(final) == sorted(alone)
  for key in alone:
    np.testing.assert_array_equal(final[key], alone[key], err_msg=key)


def config():
  """ARGS as a config, for runs in this test's process."""
  return configured(tiny.get_config(), {
      a.split("=")[0][len("--config."):]: int(a.split("=")[1])
      for a in ARGS[1:]})


def test_a_holder_killed_with_kill9_does_not_block_the_rerun(tmp_path, caplog):
  """The rerun in this test's process: another PID on this host."""
  workdir = tmp_path / "run"
  args = (*ARGS, "--config.train.steps=2000", f"--workdir={workdir}")
  proc = popen_looper(*args, log=tmp_path / "a.log")
  try:
    wait_for(proc.log, "Saved ")
    proc.kill()  # not reaped yet while the rerun starts: a zombie
    assert json.loads(lease_file(workdir).read_text())["pid"] == proc.pid
    with caplog.at_level(logging.WARNING):
      run_here(*args)
  finally:
    proc.wait()
  assert "Took over --workdir" in caplog.text
  assert not lease_file(workdir).exists()
  assert len(curve(workdir / "train")) == 2000


def test_a_run_whose_lease_was_taken_over_stops_without_saving(tmp_path):
  """An old chief back from a partition: another run holds the workdir."""
  workdir = tmp_path / "run"
  proc = popen_looper(*ARGS, "--config.train.steps=1000000",
                      f"--workdir={workdir}", log=tmp_path / "old.log")
  try:
    wait_for(proc.log, "Saved ")
    # What a run on another host writes once this lease lapsed.
    lease_file(workdir).write_text(json.dumps({
        "host": "elsewhere", "boot": "b", "pid": 4242, "pid_start": "1",
        "token": "new-run", "since": time.time(), "renewed": time.time()}))
    saved = set((workdir / "checkpoints").glob("*.index"))
    assert proc.wait(timeout=120) == 1
  finally:
    proc.kill()
    proc.wait()
  log = proc.log.read_text()
  assert re.fullmatch(catalogue.looper_line(
      "lease-taken-over", workdir=workdir, host="elsewhere", pid=4242),
                      looper_lines(log)[-1]), log[-3000:]
  # At most the save under way when the file changed got through.
  assert len(set((workdir / "checkpoints").glob("*.index")) - saved) <= 1
  assert json.loads(lease_file(workdir).read_text())["token"] == "new-run"
