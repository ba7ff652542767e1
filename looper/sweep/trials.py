"""One trial's process: its command, where it runs, how it starts, what it logged.

Synopsis::

    starter = trials.load_starter(None)   # warm.Warm, or --starter=MOD:NAME
    slots = trials.slots(parallel=2, devices_per_trial=1)  # env + CPUs each
    argv = trials.command(config, folder, overrides + trials.params_flags(p))
    proc = starter.start(argv, env=env, stdout=log, stderr=log, cpus=cpus)
    trials.evaluations(folder)     # [(step, eval line)] of its metrics.jsonl
    trials.last_error(log)         # its one `looper: ...` line, if any

Each trial is a normal looper run (`python -m looper.main
--mode=train_and_eval`) in `DIR/trials/<number>`, its sampled values as
`--config.FIELD=VALUE` after the command line's overrides and the study's
own (`study_flags`: the swept fields as HParams columns, the trackers'
group). A starter is any
object with `start(argv, *, env, stdout, stderr, cpus)` returning a
Popen-like process (poll, wait, send_signal, pid), and may have
`prepare(env=, cpus=)` (a process made ready for the slot's next trial)
and `close()`; `Popen` here starts a
subprocess that receives SIGTERM if the worker dies (Linux's parent-death
signal: it saves and stops, and the next worker resumes it), the default
looper.sweep.warm one that imported TensorFlow ahead; the tests
start trials as forks of a process that imported TensorFlow once
(tests/fixtures/forks.py) through `--starter`.

Devices: with GPUs (CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`), trial
slot i gets GPUs [i * devices_per_trial, (i+1) * devices_per_trial); on a
CPU, each of `parallel` slots gets its share of this process' cores (CPU
affinity, which TensorFlow sizes its thread pools by).
"""

import ctypes
import json
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


class Popen:
  """The default starter (module doc)."""

  def start(self, argv, *, env, stdout: str, stderr: str, cpus=None,
            stdin=None):
    def child():
      ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
      if cpus:
        os.sched_setaffinity(0, cpus)
    with open(stdout, "ab") as out, open(stderr, "ab") as err:
      return subprocess.Popen(argv, env=env, stdin=stdin, stdout=out,
                              stderr=err, preexec_fn=child)


def load_starter(spec: str | None):
  """The starter `MODULE:NAME` names (a class or a factory), or
  looper.sweep.warm's (trials that imported TensorFlow ahead)."""
  # pylint: disable=g-import-not-at-top
  if not spec:
    from looper.sweep import warm
    return warm.Warm()
  import importlib
  # pylint: enable=g-import-not-at-top
  module, _, name = spec.partition(":")
  return getattr(importlib.import_module(module), name)()


def _gpus(environ) -> list[str]:
  listed = environ.get("CUDA_VISIBLE_DEVICES")
  if listed is not None:
    return [g for g in listed.split(",") if g.strip()]
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                         text=True, timeout=10, check=False).stdout
  except (OSError, subprocess.TimeoutExpired):
    return []
  return [str(i) for i, l in enumerate(out.splitlines()) if l.startswith("GPU")]


def slots(parallel: int, devices_per_trial: int, environ=os.environ
          ) -> list[tuple[dict, list[int] | None]]:
  """(environment additions, CPUs) of each of `parallel` trial slots
  (module doc); ValueError (one line) if the GPUs do not go round."""
  gpus = _gpus(environ)
  if gpus:
    need = parallel * devices_per_trial
    if need > len(gpus):
      raise ValueError(
          f"--parallel={parallel} x --devices_per_trial={devices_per_trial}"
          f" needs {need} GPUs; this machine has {len(gpus)}")
    return [({"CUDA_VISIBLE_DEVICES": ",".join(
        gpus[i * devices_per_trial:(i + 1) * devices_per_trial])}, None)
            for i in range(parallel)]
  cores = sorted(os.sched_getaffinity(0))
  share = max(1, len(cores) // parallel)
  return [({}, cores[(i * share) % len(cores):][:share] or cores)
          for i in range(parallel)]


def launch(slot) -> dict:
  """A starter's `env` and `cpus` for a trial of `slot` (of `slots`)."""
  return {"env": {**os.environ, **slot[0]}, "cpus": slot[1]}


def prepare(starter, slot) -> None:
  """Readies the starter's process for the next trial of `slot`, if it
  prepares any (looper.sweep.warm)."""
  if hasattr(starter, "prepare"):
    starter.prepare(**launch(slot))


def params_flags(params: dict) -> list[str]:
  from looper.sweep import space  # pylint: disable=g-import-not-at-top
  return [space.override(k, v) for k, v in params.items()]


# The config's fields `study_flags` reads (the spec child adds them).
CONFIG_READ = ("trackers", "trackers_group", "hparams_columns")


def study_flags(spec: dict, study: str) -> list[str]:
  """What every trial of `study` adds to the command line's overrides:
  its swept fields as TensorBoard's HParams columns, and the study as its
  trackers' group (MLflow's parent run, W&B's group), each unless the
  experiment or the command line set it."""
  flags = []
  if not spec.get("hparams_columns"):
    flags.append(f"--config.hparams_columns={','.join(spec['space'])}")
  if spec.get("trackers") and not spec.get("trackers_group"):
    flags.append(f"--config.trackers_group={study}")
  return flags


def command(config: str, folder: str, flags: list[str]) -> list[str]:
  return [sys.executable, "-m", "looper.main", "--mode=train_and_eval",
          f"--config={config}", f"--workdir={folder}", *flags]


def _records(folder: str) -> list[dict]:
  """The lines of the run's metrics.jsonl in `folder`, read without
  TensorFlow (a sweep's folder is on a POSIX file system). A torn last
  line (being written) is skipped; the next read has it."""
  try:
    with open(os.path.join(folder, "metrics.jsonl")) as f:
      text = f.read()
  except FileNotFoundError:
    return []
  records = []
  for line in text.splitlines():
    try:
      records.append(json.loads(line))
    except ValueError:
      continue
  return records


def evaluations(folder: str) -> list[tuple[int, dict]]:
  """The eval lines of the run in `folder` as (step, line)."""
  return [(r["step"], r) for r in _records(folder) if r.get("kind") == "eval"]


def last_step(folder: str) -> int | None:
  """The last step the run in `folder` logged (train or eval)."""
  return max((r["step"] for r in _records(folder)
              if r.get("kind") in ("train", "eval")), default=None)


def stopped_early(folder: str) -> bool:
  """Whether the run in `folder` stopped before its `train.steps` (a
  SIGTERM not the worker's: it saved and exits 0 unfinished). Unknown
  (steps counted in epochs) is not early."""
  try:
    with open(os.path.join(folder, "config.json")) as f:
      steps = json.load(f)["train"]["steps"]
  except (OSError, ValueError, KeyError):
    return False
  last = last_step(folder)
  return bool(steps) and last is not None and last < steps


def last_error(log: str) -> str | None:
  """The last `looper: ...` line of a trial's log (its one-line error)."""
  try:
    with open(log, errors="replace") as f:
      lines = [l.strip() for l in f if l.startswith("looper: ")]
  except FileNotFoundError:
    return None
  return lines[-1][len("looper: "):] if lines else None
