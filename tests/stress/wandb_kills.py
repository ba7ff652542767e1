"""W&B kill -9 trials: random named moments, then the rerun: each point once.

Synopsis::

    python -m tests.stress.wandb_kills --trials 10      # by hand, ~10 s a trial
    python -m tests.stress.wandb_kills --trials 3 --seed 7

Per trial, in a fresh workdir (tests/fixtures/wandb_kills.py's run:
tiny_media, 120 steps, W&B offline): one to three attempts, each killed
(SIGKILL, by the process itself: tests/fixtures/killer.py) at a moment
drawn from MOMENTS (the Nth `Run.log` at a random N up to the run's ~60,
before or after it returned; right after `wandb.init`; in `Run.finish`,
before its exit record or a random delay into it; after it returned),
then a rerun to the end. A trial is exact when the workdir's one W&B run
holds every (key, step) of metrics.jsonl once, the action's image,
histogram and text once at each of its steps, as written, and the final
figures (`wandb_kills.check_run`). An attempt
whose moment never came (a resumed run logs less) just ends.
"""

import argparse
import os
import pathlib
import random
import shutil
import sys
import tempfile
import time

from tests.fixtures import private_home
from tests.fixtures.processes import LOOPBACK_ENV

LOG = "wandb.sdk.wandb_run:Run.log"
FINISH = "wandb.sdk.wandb_run:Run._on_finish"
# name -> the kill (killer.argv's arguments), given the trial's draws.
MOMENTS = {
    "init": lambda rng: {"at": "wandb:init", "when": "after"},
    "log": lambda rng: {"at": LOG, "when": rng.choice(["before", "after"]),
                        "nth": rng.randint(1, 60)},
    "finish": lambda rng: {"at": FINISH, "when": "before"},
    "finishing": lambda rng: {"at": FINISH, "when": "during",
                              "delay": rng.uniform(0.0, 0.5)},
    "finished": lambda rng: {"at": "wandb.sdk.wandb_run:Run.finish",
                             "when": "after"},
}


def trial(workdir: pathlib.Path, rng: random.Random) -> list[str]:
  """The attempts' kills (what each met), the rerun, the check (raises)."""
  from tests.fixtures import wandb_kills  # pylint: disable=g-import-not-at-top
  what = []
  for _ in range(rng.randint(1, 3)):
    name = rng.choice(sorted(MOMENTS))
    kill = MOMENTS[name](rng)
    proc = wandb_kills.attempt(workdir, kill)
    detail = ",".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in kill.items() if k not in ("at",))
    what.append(f"{name}({detail}): " + ("killed" if proc.returncode == -9
                                         else f"exit {proc.returncode}"))
    if proc.returncode not in (0, -9):
      raise AssertionError(f"attempt failed:\n{proc.stderr[-3000:]}")
  proc = wandb_kills.attempt(workdir)
  if proc.returncode != 0:
    raise AssertionError(f"the rerun failed:\n{proc.stderr[-3000:]}")
  wandb_kills.check_run(workdir, attempts=len(what) + 1)
  return what


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  # As the test session: loopback only, a HOME of its own, W&B offline.
  os.environ.update(LOOPBACK_ENV, WANDB_MODE="offline")
  os.environ.pop("WANDB_SERVICE", None)
  private_home.enter()
  root = pathlib.Path(tempfile.mkdtemp(prefix="looper-wandb-kills-"))
  rng, exact, started = random.Random(args.seed), 0, time.monotonic()
  try:
    for i in range(args.trials):
      try:
        kills = trial(root / f"trial{i}", rng)
        exact += 1
        print(f"trial {i}: {'; '.join(kills)} -> exact", flush=True)
      except AssertionError as e:
        print(f"trial {i}: NOT exact: {str(e)[:2000]}", flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)
    private_home.leave()
  print(f"{exact} of {args.trials} trials exact (W&B offline, kill -9 at"
        f" named moments, then the rerun), {time.monotonic() - started:.0f} s",
        flush=True)
  return 0 if exact == args.trials else 1


if __name__ == "__main__":
  sys.exit(main())
