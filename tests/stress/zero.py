"""The sharded optimizer (distribution.shard_optimizer) against the
replicated one, over the options a step carries: outside the suite.

Synopsis::

    python -m tests.stress.zero                    # 2 and 4 replicas
    python -m tests.stress.zero --replicas 2 --cases clip,fp16
    python -m tests.stress.zero --workers 2 --cases clip,embedding

Per case and replica count (a process each: one MirroredStrategy per
process), the tiny experiment's Trainer runs replicated, then sharded, for
STEPS steps; it prints the largest relative difference of the per-step
losses and of the final weights (the contract: <= 1e-6 in float32), and
the optimizer state per device of each, the sharded one checked against
what the replicated run built (`expected_bytes`). Exit status 1 if a case
is over or its sharded state is not that.
With --workers, each case runs as a 2-worker MultiWorkerMirroredStrategy
job (looper.cli.launch on 127.0.0.1, one replica each) instead, and the
final checkpoints (weights, Adam's slots, the EMA: one layout) are
compared tensor by tensor.
"""

import argparse
import json
import subprocess
import sys

import numpy as np

from tests.fixtures.paths import ROOT

STEPS = 12
# name -> config fields (the tiny experiment's).
CASES = {
    "clip": {"optimizer.name": "adam", "optimizer.clip_global_norm": 0.3},
    "accumulation": {"optimizer.name": "adamw", "optimizer.weight_decay": 0.1,
                     "train.grad_accum_steps": 2},
    "bf16": {"optimizer.name": "adam", "train.precision": "mixed_bfloat16"},
    "fp16": {"optimizer.name": "adam", "train.precision": "mixed_float16"},
    "ema": {"optimizer.name": "adam", "optimizer.ema_decay": 0.9},
    "embedding": {"optimizer.name": "adam", "model.embed": 4},
    "embedding_sgd": {"model.embed": 4},  # plain SGD: a sparse update
    "dropout_sgd": {"model.dropout": 0.3, "optimizer.momentum": 0.9},
    "class_weights": {"optimizer.name": "adam",
                      "data.class_weights": (1.0, 3.0, 1.0, 0.5)},
    # Kernels of 128 and 64 KiB: the first gathered alone (sharding.ALONE).
    "wide": {"optimizer.name": "adam", "optimizer.ema_decay": 0.9,
             "model.width": 4096},
}


def _relative(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def expected_bytes(strategy, trainer) -> int:
  """The sharded state per device a replicated `trainer` implies: its
  scalars (the step, a loss scale) whole, ceil(size / N) of each other
  variable it built (slots, averages) and of each weight (the shard)."""
  from looper.options import optimizer_state  # pylint: disable=g-import-not-at-top
  n = strategy.num_replicas_in_sync
  state = [*trainer.update.optimizer.variables,
           *(trainer.ema.averages if trainer.ema else [])]
  device, parts = next(iter(optimizer_state.held(strategy, state).items()))
  weights = optimizer_state.held(strategy,
                                 trainer.model.trainable_variables)[device]
  return sum(d.size * (1 if s.rank == 0 else -(-s.num_elements() // n))
             for _, d, s in parts + weights)


def measure(replicas: int, cases: list[str]) -> dict:
  """In this process: each case on `replicas` CPU devices."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  from looper.options import optimizer_state  # pylint: disable=g-import-not-at-top
  from looper.options import sharding  # pylint: disable=g-import-not-at-top
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  from tests.fixtures import tiny  # pylint: disable=g-import-not-at-top
  from tests.fixtures.configs import configured  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(distribute.split_cpu(replicas))
  out = {}
  for case in cases:
    runs, built = {}, None
    for shard in (False, True):
      config = configured(tiny.get_config(), CASES[case],
                          distribution__shard_optimizer=shard)
      t = pieces.trainer(config, strategy)
      losses = t.train(STEPS)[0]
      # Bytes can match by chance (SGD's momentum over even sizes): the
      # update built must be the sharded one too.
      built = isinstance(t.update, sharding.Sharded) if shard else built
      runs[shard] = (losses, [v.numpy() for v in t.model.trainable_variables],
                     optimizer_state.per_device(strategy, t.update, t.ema),
                     None if shard else expected_bytes(strategy, t))
    out[case] = dict(
        losses=_relative(runs[True][0], runs[False][0]),
        weights=max(_relative(a, b) for a, b in zip(runs[True][1],
                                                    runs[False][1])),
        bytes=[runs[False][2], runs[True][2], runs[False][3]], sharded=built)
  return out


def launched(workers: int, cases: list[str], directory: str) -> dict:
  """Each case as a `workers`-worker job, replicated then sharded: the
  relative differences of the curves and of every checkpointed tensor."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests.fixtures import events  # pylint: disable=g-import-not-at-top
  from tests.unit.cli.test_launch import launch  # pylint: disable=g-import-not-at-top
  out = {}
  for case in cases:
    runs, built = {}, None
    for shard in (False, True):
      workdir = f"{directory}/{case}-{shard}"
      proc = launch(
          "--config=tests/fixtures/tiny.py", f"--workdir={workdir}",
          f"--config.train.steps={STEPS}", "--config.train.steps_per_loop=4",
          f"--config.distribution.shard_optimizer={shard}",
          *(f"--config.{k}={v}" for k, v in CASES[case].items()),
          workers=workers)
      log = proc.communicate(timeout=600)[0]
      if proc.returncode != 0:
        raise RuntimeError(f"{case}, shard_optimizer={shard}:\n{log[-3000:]}")
      saved = tf.train.load_checkpoint(f"{workdir}/checkpoints")
      runs[shard] = (events.curve(f"{workdir}/train"), {
          k: saved.get_tensor(k) for k in saved.get_variable_to_shape_map()
          if k != "_CHECKPOINTABLE_OBJECT_GRAPH"})
    (a, saved_a), (b, saved_b) = runs[True], runs[False]
    assert saved_a.keys() == saved_b.keys(), case
    out[case] = dict(losses=_relative(a, b), weights=max(
        _relative(saved_a[k], saved_b[k]) for k in saved_a
        if np.asarray(saved_b[k]).dtype.kind == "f"))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--replicas", default="2,4")
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--workers", type=int, default=0)
  args = parser.parse_args(argv)
  if args.workers:
    import tempfile  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as directory:
      return _report(f"{args.workers} workers", launched(
          args.workers, args.cases.split(","), directory))
  over = 0
  for n in args.replicas.split(","):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.stress.zero", "--measure", n,
         args.cases], cwd=ROOT, capture_output=True, text=True, timeout=1800,
        check=False)
    if proc.returncode != 0:
      print(f"{n} replicas failed:\n{proc.stderr[-3000:]}")
      return 1
    over += _report(f"{n} replicas",
                    json.loads(proc.stdout.strip().splitlines()[-1]))
  return 1 if over else 0


def _report(where: str, results: dict) -> int:
  """Prints each case's line; 1 if one is over 1e-6 or its sharded state
  is not the one its replicated build implies, else 0."""
  over = 0
  for case, r in results.items():
    line = (f"{where}, {case}: losses {r['losses']:.1e}, weights"
            f" {r['weights']:.1e} relative")
    bad = max(r["losses"], r["weights"]) > 1e-6
    if bad:
      line += "  OVER 1e-6"
    if "bytes" in r:
      replicated, sharded, expected = r["bytes"]
      line += (f"; optimizer state per device {replicated} B replicated,"
               f" {sharded} B sharded")
      if sharded != expected:
        line += f"  NOT the {expected} B its replicated build implies"
        bad = True
      if not r["sharded"]:
        line += "  NOT SHARDED: the run built a replicated update"
        bad = True
    over += bad
    print(line, flush=True)
  return 1 if over else 0


if __name__ == "__main__":
  if sys.argv[1:2] == ["--measure"]:
    import os  # pylint: disable=g-import-not-at-top
    print(json.dumps(measure(int(sys.argv[2]), sys.argv[3].split(","))),
          flush=True)
    os._exit(0)  # pylint: disable=protected-access
  sys.exit(main())
