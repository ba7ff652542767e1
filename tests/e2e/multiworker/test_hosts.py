"""Workers on separate hosts (network namespaces): exactness and a cut link.

On 127.0.0.1 a dead peer is a reset connection the moment its process
dies; between hosts the common fault is a host that goes silent (a switch
port, a preempted VM's NIC), and collectives hang rather than fail. Here
each worker runs in its own namespace on a bridge (tests/fixtures/hosts.py),
and a link is cut by bringing its switch port down mid-loop:
- 3 hosts give the per-step losses of one process, eval counting every
  example once, in array and file mode (element mode, the same check:
  `python -m tests.stress.hosts`; 3 workers in element mode against one
  process in the suite: test_slurm.py's three tasks);
- a cut worker ends every worker within distribution.worker_timeout_secs
  plus a margin, each with one line naming the task it lost, non-zero;
  every checkpoint stays readable (a cut chief, the same from its side:
  `python -m tests.stress.hosts --cuts=1,0`);
- a blip (the link back within an eighth of the timeout) is ridden out:
  the run ends normally, one set of checkpoints, by the chief;
- and the run of those attempts (file mode) ends bit-exactly where
  an uninterrupted one does (element mode resumes on 2 workers in
  test_multiworker.py and test_slurm.py), whose workers are new
  interpreters, as on machines of their own: each its own string-hash
  seed, TensorFlow imported by itself, a first screen without
  TensorFlow's start-up lines (the fresh lane).
Skipped with one line where a prerequisite is missing (root, its network
capabilities, `ip`); namespaces that cannot be made despite them fail.
"""

import re
import time

import numpy as np
import pytest

from looper.data import shards
from tests.fixtures import tiny
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.configs import run_here
from tests.fixtures.events import curve, scalars
from tests.fixtures.hosts import Hosts
from tests.fixtures.processes import (TENSORFLOW_CHATTER, looper_lines,
                                      probed, wait_for)

# Subprocesses in namespaces: the slow lane (BUILD.md).
pytestmark = pytest.mark.slow

TIMEOUT = 8  # distribution.worker_timeout_secs: registration and heartbeats
MARGIN = 12  # the heartbeat check's period, the error's way out, exit
# Heartbeats time out after TIMEOUT / 2 (looper.options.distribute); a cut that
# long, with TCP's retransmission back-off after it, may end the run (in
# one line, as a cut does). An outage of an eighth of it is ridden out.
BLIP = TIMEOUT / 8
# 48 splits over 1, 2 and 3 replicas; 1009 examples is a prime.
ARGS = ("--config=tests/fixtures/tiny.py", "--config.train.batch_size=48",
        "--config.eval.batch_size=48", "--config.model.num_examples=1009",
        "--config.model.dropout=0.3",
        f"--config.distribution.worker_timeout_secs={TIMEOUT}")
SHORT = ("--config.train.steps=20", "--config.train.steps_per_loop=5",
         "--config.checkpoint.every_steps=10", "--config.eval.every_steps=10")
# Long enough to cut a link in three attempts' middles: each resumes, saves
# 100 steps on (~0.4 s on 2 hosts here) and is cut once it has.
LONG = ("--config.train.steps=600", "--config.train.steps_per_loop=20",
        "--config.checkpoint.every_steps=100", "--config.eval.every_steps=300")


def write_modes(root) -> dict:
  """Flags of element, array and file mode (48 groups: 1, 2 or 3 replicas),
  the file mode's shards written under `root`."""
  c = tiny.get_config()
  c.model.num_examples = 1009
  for split in ("train", "test"):
    shards.write(tiny.dataset_fn(c, split), f"{root}/{split}", min_shards=48)
  return {"elements": (),
          "arrays": ("--config.data.as_arrays=True",),
          "files": (f"--config.data.shards_dir={root}",
                    "--config.data.virtual_shards=48")}


@pytest.fixture(scope="module")
def modes(tmp_path_factory):
  return write_modes(tmp_path_factory.mktemp("shards"))


def run_hosts(net: Hosts, *args, timeout: float = 300,
              fresh: bool = False) -> list[str]:
  net.procs = []
  net.start_workers((*ARGS, *args), fresh=fresh)
  logs = net.finish(timeout)
  assert [p.returncode for p in net.procs] == [0] * net.n, logs[0][-3000:]
  return logs


def three_hosts_equal_one_process(tmp_path, modes) -> None:  # pylint: disable=redefined-outer-name
  """3 hosts give one process's per-step losses in each of `modes` (name:
  flags), eval counting every example once, every file written once, by
  the chief."""
  with Hosts(3, tmp_path) as net:
    for mode, flags in modes.items():
      run_hosts(net, *flags, *SHORT, f"--workdir={tmp_path}/{mode}-hosts")
  for mode, flags in modes.items():
    run_here(*ARGS, *flags, *SHORT, f"--workdir={tmp_path}/{mode}-one")
    np.testing.assert_allclose(
        curve(tmp_path / f"{mode}-hosts" / "train"),
        curve(tmp_path / f"{mode}-one" / "train"), rtol=1e-5, err_msg=mode)
    assert scalars(tmp_path / f"{mode}-hosts" / "eval", "examples") == {
        10: 1009, 20: 1009}, mode
    # Written once, by the chief: no worker scratch, one HParams row.
    assert sorted(p.name for p in (tmp_path / f"{mode}-hosts").iterdir()) == [
        "checkpoints", "config.json", "eval", "goodput", "hparams",
        "metrics.jsonl", "train"], mode
    assert len(list((tmp_path / f"{mode}-hosts" / "hparams").glob(
        "*tfevents*"))) == 1


def test_three_hosts_equal_one_process_in_array_and_file_mode(tmp_path, modes):
  """Element mode's 3 workers against one process are test_slurm.py's three
  tasks in the suite; on hosts, by hand: python -m tests.stress.hosts."""
  three_hosts_equal_one_process(
      tmp_path, {mode: modes[mode] for mode in ("arrays", "files")})


# Who is cut, who must name whom: the chief names the lost worker; a
# worker that loses the chief (the coordination service) names it.
LOST_WORKER = (r"looper: lost worker /job:worker/replica:0/task:1 \(it stopped"
               r" sending heartbeats\)")
LOST_CHIEF = (r"looper: lost the chief /job:worker/replica:0/task:0 \(no"
              rf" answer to heartbeats within"
              rf" distribution.worker_timeout_secs={TIMEOUT}: its host is"
              r" unreachable or gone\)")


def cut_mid_run(net: Hosts, cut: int, args, workdir) -> None:
  """Starts the run, cuts host `cut`'s link once it saved: both workers
  end in time, non-zero, each in one line naming whom it lost; every
  checkpoint kept is readable, no worker scratch; then the link is back."""
  net.procs = []
  net.start_workers((*ARGS, *args))
  wait_for(net.procs[0].log, "Saved ")
  net.cut(cut)
  cut_at = time.monotonic()
  ended = {}
  while len(ended) < 2 and time.monotonic() - cut_at < 120:
    for i, proc in enumerate(net.procs):
      if i not in ended and proc.poll() is not None:
        ended[i] = time.monotonic() - cut_at
    time.sleep(0.1)
  logs = net.finish(timeout=1)
  codes = [p.returncode for p in net.procs]
  assert codes == [1, 1], (cut, codes, logs[1 - cut][-3000:])
  # The survivor in time, both in one line naming whom they lost.
  assert ended[1 - cut] < TIMEOUT + MARGIN, (cut, ended)
  assert ended[cut] < TIMEOUT + MARGIN, (cut, ended)
  for i, log in enumerate(logs):
    lines = looper_lines(log)
    want = LOST_WORKER if i == 0 else LOST_CHIEF
    assert len(lines) == 1 and re.match(want + "; this worker stopped too."
                                        " Restart all workers", lines[0]), (
                                            cut, i, log[-3000:])
  # Every checkpoint kept is readable; no worker left scratch behind.
  kept = sorted((workdir / "checkpoints").glob("ckpt-*.index"))
  assert kept
  for index in kept:
    assert checkpoint_tensors(str(index)[:-len(".index")])
  assert not list(workdir.glob(".worker*"))
  reached = max(scalars(workdir / "train", "loss"))
  assert reached < 600, reached  # cut mid-run
  print(f"host {cut} cut at step {reached}: ended after {ended}")
  net.restore(cut)


def cuts_then_a_blip_end_exact(tmp_path, modes, cuts) -> None:  # pylint: disable=redefined-outer-name
  """Attempts of one run, each the same command on both hosts: one per
  host in `cuts` (its link cut mid-run; each resumed), then a blip; it
  ends bit for bit where the same run on the same hosts uninterrupted
  ends."""
  workdir = tmp_path / "run"
  args = (*modes["files"], *LONG, f"--workdir={workdir}")
  with Hosts(2, tmp_path) as net:
    for cut in cuts:
      cut_mid_run(net, cut, args, workdir)
    # A blip (the link back within an eighth of the timeout): ridden out,
    # the run ends normally.
    net.procs = []
    net.start_workers((*ARGS, *args))
    wait_for(net.procs[0].log, "Saved ")
    net.cut(1)
    time.sleep(BLIP)
    net.restore(1)
    logs = net.finish(timeout=300)
    assert [p.returncode for p in net.procs] == [0, 0], logs[0][-3000:]
    assert not looper_lines(logs[0]) and not looper_lines(logs[1])
    # One writer: the chief's checkpoints only, each step saved once.
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [
        "checkpoint", *sorted(f"ckpt-{s}.{ext}" for s in (400, 500, 600)
                              for ext in ("data-00000-of-00001", "index"))]
    assert not list(workdir.glob(".worker*"))
    logs = run_hosts(net, *modes["files"], *LONG,
                     f"--workdir={workdir}-uninterrupted", fresh=True)
  probes = [probed(log) for log in logs]
  assert probes[0]["hash"] != probes[1]["hash"], probes
  assert not any(p["tensorflow_loaded"] for p in probes), probes
  for log in logs:  # TensorFlow's start-up lines: none before the header
    lines = log.splitlines()
    header = next(i for i, l in enumerate(lines)
                  if " looper train_and_eval: " in l)
    assert not [l for l in lines[:header]
                if any(c in l for c in TENSORFLOW_CHATTER)], log[:3000]
  np.testing.assert_array_equal(curve(workdir / "train"),
                                curve(f"{workdir}-uninterrupted/train"))
  state, want = (checkpoint_tensors(f"{w}/checkpoints/ckpt-600")
                 for w in (workdir, f"{workdir}-uninterrupted"))
  assert sorted(state) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(state[key], want[key], err_msg=key)
  assert scalars(workdir / "eval", "examples") == {300: 1009, 600: 1009}


def test_cut_links_end_in_one_line_a_blip_is_ridden_out_the_rerun_is_exact(
    tmp_path, modes):
  """A cut worker, then (resumed) a blip: the run ends as one uninterrupted.
  (A cut chief, the same lines from the other side: python -m
  tests.stress.hosts --cuts=1,0. Hosts equal one process: the test above.)"""
  cuts_then_a_blip_end_exact(tmp_path, modes, cuts=(1,))
