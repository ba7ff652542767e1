"""kill -9 trials: a run killed at random moments ends as if never stopped.

Synopsis::

    python -m tests.stress.kill9 --trials 20          # by hand, ~15 minutes
    python -m tests.stress.kill9 --trials 3 --kinds save,loop,eval
    python -m tests.stress.kill9 --flags="--config.train.precision=mixed_bfloat16
        --config.train.grad_accum_steps=2 --config.model.dropout=0.3"

One uninterrupted reference run, then per trial: start the same command in
a fresh workdir, SIGKILL it at a chosen moment, rerun the same command, and
repeat until a run exits 0. The kill moment is one of:
  loop  a random delay after the first progress line (inside training);
  save  the moment a checkpoint's temporary files appear on disk;
  eval  right after the progress line of an eval step (during evaluation).
A trial is bit-exact when every tensor of the final checkpoint (model,
optimizer, step, data position, random layers' states), the per-step
curves read back from TensorBoard (steps 1..N once each: the loss and the
values tiny.StepValues' train_step returns beside it), metrics.jsonl's
train lines (each step once, the loops' means of those values) and the
eval scalars equal the reference.
"""

import argparse
import dataclasses
import os
import pathlib
import random
import signal
import shutil
import sys
import threading
import time

import numpy as np

from looper.workdir import jsonl
from tests.fixtures.checkpoints import checkpoint_tensors
from tests.fixtures.events import curve, scalars
from tests.fixtures.processes import popen_looper, run_looper

# Keras' own random layers (Dropout, noise, flips, attention dropout) on 2
# replicas: their draws must continue, not restart, after a kill.
ARGS = ("--config=tests/fixtures/tiny.py",
        "--config.trainer=tests.fixtures.tiny:StepValues",
        "--config.distribution.num_cpu_devices=2",
        "--config.model.keras_random=True", "--config.train.steps_per_loop=5",
        "--config.checkpoint.every_steps=10", "--config.eval.every_steps=20",
        "--config.checkpoint.keep=100")
TOTAL = 120  # train.steps of the trials; the suite's test runs fewer
PER_STEP = ("loss", "label_mean", "examples")  # tiny.StepValues' values
KINDS = ("loop", "save", "eval")


def run_to_end(workdir: pathlib.Path, steps: int = TOTAL,
               timeout: float = 300) -> None:
  proc = run_looper(*ARGS, f"--config.train.steps={steps}",
                    f"--workdir={workdir}", timeout=timeout)
  if proc.returncode != 0:
    raise RuntimeError(f"run in {workdir} failed:\n{proc.stderr[-3000:]}")


def run_and_kill(workdir: pathlib.Path, kind: str, rng: random.Random,
                 steps: int = TOTAL, timeout: float = 300) -> str:
  """Starts a run, SIGKILLs it at a `kind` moment; returns what happened."""
  proc = popen_looper(*ARGS, f"--config.train.steps={steps}",
                      f"--workdir={workdir}")
  lines, progress = [], threading.Event()
  eval_line = threading.Event()

  def read():
    for line in proc.stderr:
      lines.append(line)
      if "train step " in line:
        progress.set()
        step = int(line.split("train step ")[1].split("/")[0])
        if step % 20 == 0:
          eval_line.set()
    # The run ended (finished, or resumed a finished run): stop waiting for
    # a line that will not come; the poll below says it exited.
    proc.wait()
    progress.set()
    eval_line.set()

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  deadline = time.monotonic() + timeout
  what = "exited before the kill"
  try:
    if kind == "loop":
      if progress.wait(timeout):
        time.sleep(rng.uniform(0.0, 1.0))  # training lasts ~1 s
        what = "killed in training"
    elif kind == "eval":
      if eval_line.wait(timeout):
        what = "killed after an eval step's progress line"
    elif kind == "save":
      ckpt = workdir / "checkpoints"
      while proc.poll() is None and time.monotonic() < deadline:
        if ckpt.is_dir() and any("temp" in p for p in os.listdir(ckpt)):
          what = "killed while a checkpoint was being written"
          break
        time.sleep(0.0005)
    if proc.poll() is not None:
      what = "exited before the kill"
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.kill()
    proc.wait(timeout=30)
    reader.join(timeout=5)
  return what


@dataclasses.dataclass
class Outcome:
  kind: str
  kills: list[str]
  exact: bool
  detail: str


def compare(reference: pathlib.Path, workdir: pathlib.Path,
            steps: int = TOTAL) -> str:
  """'' when bit-exact, else what differs."""
  final = lambda d: checkpoint_tensors(d / "checkpoints" / f"ckpt-{steps}")
  want, got = final(reference), final(workdir)
  if sorted(want) != sorted(got):
    return f"checkpoint keys differ: {sorted(set(want) ^ set(got))}"
  for key in want:
    if not np.array_equal(want[key], got[key]):
      return f"{key} differs"
  for name in PER_STEP:
    try:
      got_curve = curve(workdir / "train", name)
    except AssertionError as e:
      return f"train {name} steps are not 1..{steps} once each: {e}"
    if not np.array_equal(curve(reference / "train", name), got_curve):
      return f"per-step {name} differs"
  lines = {d: [(l["step"], *(l[n] for n in PER_STEP))
               for l in jsonl.read(str(d / "metrics.jsonl"))
               if l["kind"] == "train"] for d in (reference, workdir)}
  if lines[reference] != lines[workdir]:
    return f"metrics.jsonl's train lines differ: {lines[workdir]}"
  for tag in ("loss", "accuracy", "examples"):
    if scalars(reference / "eval", tag) != scalars(workdir / "eval", tag):
      return f"eval {tag} differs"
  return ""


def trial(reference: pathlib.Path, workdir: pathlib.Path, kind: str,
          rng: random.Random) -> Outcome:
  kills = []
  for _ in range(rng.randint(1, 3)):
    what = run_and_kill(workdir, kind, rng)
    kills.append(what)
    if what == "exited before the kill":
      break
  run_to_end(workdir)
  detail = compare(reference, workdir)
  return Outcome(kind, kills, not detail, detail or "bit-exact")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--kinds", default=",".join(KINDS))
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--dir", default="/tmp/looper-kill9")
  parser.add_argument("--flags", default="",
                      help="more looper flags for every run, space-separated")
  args = parser.parse_args(argv)
  global ARGS  # every run of the trials, the reference's too
  ARGS += tuple(args.flags.split())
  base = pathlib.Path(args.dir)
  shutil.rmtree(base, ignore_errors=True)
  base.mkdir(parents=True)
  rng = random.Random(args.seed)
  run_to_end(base / "reference")
  kinds = args.kinds.split(",")
  exact = 0
  for i in range(args.trials):
    outcome = trial(base / "reference", base / f"trial{i}", kinds[i % len(kinds)],
                    rng)
    exact += outcome.exact
    print(f"trial {i}: {outcome.kind}: {'; '.join(outcome.kills)} ->"
          f" {outcome.detail}", flush=True)
  print(f"{exact} of {args.trials} trials bit-exact")
  return 0 if exact == args.trials else 1


if __name__ == "__main__":
  sys.exit(main())
