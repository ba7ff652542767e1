"""MLflow kill trials: a run killed at random MLflow moments ends as one exact run.

Synopsis::

    python -m tests.stress.mlflow_kills --trials 20        # ~1 min per 6
    python -m tests.stress.mlflow_kills --trials 5 --stores=server --seed=3

Per trial, in a fresh workdir, against the workdir's store (`local`) or a
real `mlflow server` on 127.0.0.1 (`server`, one for all trials): start
tiny_media (80 steps, a save every 20, 1 step per loop: sends of ~260
metrics, the last two log_batch requests, then 2 steps' images, 2 a step,
and texts) killed (SIGKILL, tests/fixtures/killer.py)
at a random call of a random moment, rerun the same command killed again
at another (half the trials), then run it to its end. The moments:
  store        after the Nth of the 98 tables MLflow makes (local: its
               first tables, then those of its ~100 migrations)
  create_run   as create_run returns, before looper keeps the run's id
  log_batch    before or after the Nth log_batch (the params, each send)
  log_image    before or after the Nth of the 16 images
  terminated   before or after set_terminated (the final status)
  timed        a random moment 0-6 s after the start (any of them)
A kill at a call the run never reaches leaves it to end (said so). A trial
is exact when the store holds one run, the workdir's, FINISHED, with each
(metric, step) of metrics.jsonl once and the final figures once
(tests/fixtures/mlflow_runs.exact_run), each image once at its step, as
written, and each text (exact_media), and no process printed anything but
looper's lines.
"""

import argparse
import contextlib
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

from looper import workdir as workdir_lib
from tests.fixtures import mlflow_runs
from tests.fixtures.servers import mlflow_server

ARGS = ("--config=tests/fixtures/tiny_media.py", "--config.trackers=mlflow",
        "--config.train.steps=80", "--config.train.steps_per_loop=1",
        "--config.checkpoint.every_steps=20", "--config.eval.every_steps=40")
CLIENT = "mlflow.tracking.client:MlflowClient."
# moment: (the call, whens, the largest N drawn, the stores it happens in)
MOMENTS = {
    "store": ("sqlalchemy:after_create", ("after",), 98, ("local",)),
    "create_run": (CLIENT + "create_run", ("after",), 1, ("local", "server")),
    "log_batch": (CLIENT + "log_batch", ("before", "after"), 7,
                  ("local", "server")),
    "log_image": (CLIENT + "log_image", ("before", "after"), 16,
                  ("local", "server")),
    "terminated": (CLIENT + "set_terminated", ("before", "after"), 1,
                   ("local", "server")),
    "timed": (None, (), 0, ("local", "server")),
}


def kill_once(args, store: str, folder: pathlib.Path,
              rng: random.Random) -> str:
  """One start of ARGS, killed at a random moment; what happened."""
  moment = rng.choice([m for m, v in MOMENTS.items() if store in v[3]])
  at, whens, most, _ = MOMENTS[moment]
  log = folder / f"killed-{time.monotonic_ns()}.log"
  if at is None:
    delay = rng.uniform(0, 6)
    proc = mlflow_runs.start(None, 0, args, log)
    try:
      proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    what = f"timed {delay:.2f} s"
  else:
    nth, when = rng.randint(1, most), rng.choice(whens)
    proc = mlflow_runs.start(at, nth, args, log, when=when)
    proc.wait(timeout=300)
    what = f"{moment} {when} #{nth}"
  said = mlflow_runs.noise(log.read_text())
  assert not said, f"{what}: {said}"
  return what + ("" if proc.returncode == -9 else " (not reached: ended)")


def trial(store: str, folder: pathlib.Path, url: str | None,
          rng: random.Random, index: int) -> str:
  """One trial (see module doc); what happened, or raises."""
  import mlflow  # pylint: disable=import-outside-toplevel
  wd_root = folder / f"run-{index}"
  os.environ.pop("MLFLOW_TRACKING_URI", None)
  os.environ.pop("MLFLOW_EXPERIMENT_NAME", None)
  if store == "server":
    os.environ["MLFLOW_TRACKING_URI"] = url
    os.environ["MLFLOW_EXPERIMENT_NAME"] = f"trial-{index}"
  args = [*ARGS, f"--workdir={wd_root}"]
  kills = [kill_once(args, store, folder, rng)]
  if rng.random() < 0.5:
    kills.append(kill_once(args, store, folder, rng))
  done = mlflow_runs.run(args)
  said = mlflow_runs.noise(done.stderr + done.stdout)
  assert not said, said
  wd = workdir_lib.Workdir(str(wd_root))
  client = mlflow.MlflowClient(url if store == "server" else
                                f"sqlite:///{wd.mlflow_db}")
  found = mlflow_runs.exact_run(client, wd, [client.get_experiment_by_name(
      f"trial-{index}").experiment_id] if store == "server" else None)
  mlflow_runs.exact_media(client, wd, found.info.run_id, range(10, 81, 10))
  return "; ".join(kills)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=6)
  parser.add_argument("--stores", default="local,server")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  rng = random.Random(args.seed)
  stores = args.stores.split(",")
  started, exact = time.monotonic(), 0
  with tempfile.TemporaryDirectory(prefix="mlflow-kills-") as tmp:
    folder = pathlib.Path(tmp)
    (folder / "server").mkdir()
    with (mlflow_server(folder / "server") if "server" in stores
          else contextlib.nullcontext()) as server:
      for i in range(args.trials):
        store = stores[i % len(stores)]
        try:
          what, ok = trial(store, folder, server and server.url, rng, i), True
        except AssertionError as e:
          what, ok = f"NOT exact: {str(e)[-1500:]}", False
        exact += ok
        print(f"trial {i} ({store}): {what}", flush=True)
  print(f"{exact} of {args.trials} trials exact ({stores}, seed"
        f" {args.seed}), {time.monotonic() - started:.0f} s")
  return 0 if exact == args.trials else 1


if __name__ == "__main__":
  sys.exit(main())
