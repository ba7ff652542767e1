"""Experiment trackers (`config.trackers`): MLflow, W&B, as writers whose history is exact across restarts.

Synopsis (what `looper.run.Run` does)::

    names = trackers.parse("mlflow,wandb")     # one line if unknown
    trackers.check("mlflow", group="mnist-lr")  # one line if bad
    built = trackers.build("mlflow", wd, group="mnist-lr")  # installed and
                                               # answering, or one line
    # each a looper.workdir.writers.Writer (looper.trackers.delivery)
    trackers.open_runs(built, config_json)     # before training
    lines = trackers.close_runs(built, durable_step, stopped=None,
                                figures={...})  # [(name, closing line)]

Modules: `delivery` (what every tracker shares: points sent once a
complete checkpoint covers them, resent from metrics.jsonl after a
restart, never twice), `mlflow`, `wandb` (each tool's own; installed with
`pip install 'looper[mlflow]'`, `'looper[wandb]'`), `wandb_files` (what
W&B's own files hold: read on every restart). Each is configured by
the tool's own environment variables; with none set its local store goes
inside the workdir. The top-level fields `trackers` and `trackers_group`
are declared here (`config()`) and checked by `check` (the Run calls it).

A group (`trackers_group`; `looper sweep` sets its study's name for each
trial) gathers runs that belong together: in MLflow each run nests under
one parent run of the group's name in its experiment (found by its tags,
made by the first run that finds none: a rerun adopts it), in W&B the
runs share the group (W&B's run group, as WANDB_RUN_GROUP sets it).
"""

import difflib
import importlib
import importlib.util
import json

from absl import logging
import ml_collections

from looper import errors
from looper import workdir as workdir_lib

# config.trackers' names -> (their module here, its class, the package).
TRACKERS = {"mlflow": ("looper.trackers.mlflow", "MLflow", "mlflow"),
            "wandb": ("looper.trackers.wandb", "WandB", "wandb")}


def config() -> ml_collections.ConfigDict:
  """The top-level field `trackers`: its default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # Experiment trackers, each set up by its own environment variables:
  c.trackers = ""  # '' | mlflow | wandb | mlflow,wandb (README)
  # Runs gathered in each tracker (module doc; a sweep's study): '' none.
  c.trackers_group = ""
  return c


# W&B's limit on a group's name; MLflow's filters quote it in ''.
GROUP_LENGTH = 128


def check(value: str, group: str = "") -> list[str]:
  """The names `config.trackers` holds (`parse`), and `trackers_group`
  checked: one line naming the field if it cannot be a group's name."""
  names = parse(value)
  if group and (len(group) > GROUP_LENGTH or "'" in group or
                not group.isprintable()):
    raise errors.ConfigError(
        f"config.trackers_group={group!r}: a group's name is one line of at"
        f" most {GROUP_LENGTH} characters without quotes; set"
        " --config.trackers_group (a sweep: --study)")
  return names


def parse(value: str) -> list[str]:
  """The names `config.trackers` holds ('' | 'mlflow' | 'wandb' |
  'mlflow,wandb'); one line naming the field for anything else."""
  names = [n.strip() for n in str(value).split(",") if n.strip()]
  for name in names:
    if name not in TRACKERS:
      close = difflib.get_close_matches(name, list(TRACKERS), n=1)
      hint = f"did you mean {close[0]!r}? " if close else ""
      raise errors.ConfigError(
          f"config.trackers={value!r}: {name!r} is not one of"
          f" {', '.join(TRACKERS)}; {hint}set --config.trackers (comma"
          " separated, '' for none)")
  if len(set(names)) < len(names):
    raise errors.ConfigError(
        f"config.trackers={value!r} names a tracker twice; name each once")
  return names


def build(value: str, wd: workdir_lib.Workdir, group: str = "") -> list:
  """The trackers `value` names, each checked (installed; a server that
  answers) before anything is written: one line if not. `group`: the
  runs' group (module doc)."""
  built = []
  for name in check(value, group):
    module, cls, package = TRACKERS[name]
    if importlib.util.find_spec(package) is None:
      raise errors.ConfigError(
          f"config.trackers={value!r}: {package} is not installed; pip"
          f" install 'looper[{name}]', or drop {name} from --config.trackers")
    built.append(getattr(importlib.import_module(module), cls)(wd,
                                                               group=group))
  return built


def params(config_json: str) -> dict[str, str]:
  """The resolved config (references.to_json) as a tracker's params: each
  field by its dotted name, its value as text (a tuple as JSON)."""
  out = {}

  def visit(prefix, value):
    if isinstance(value, dict) and value:
      for key, item in value.items():
        visit(f"{prefix}{key}.", item)
    else:
      out[prefix[:-1]] = value if isinstance(value, str) else json.dumps(value)

  visit("", json.loads(config_json))
  return out


def open_runs(built: list, config_json: str) -> None:
  """Each tracker's run, made or resumed, with the config as params."""
  for tracker in built:
    tracker.open(params(config_json))


def close_runs(built: list, durable: int | None, *, stopped: str | None = None,
               figures: dict[str, float] | None = None, failed: bool = False
               ) -> list[tuple[str, str]]:
  """The trackers' last deliveries (up to the complete checkpoint
  `durable`) and runs' ends: FINISHED with the final `figures`, KILLED
  when `stopped` (a rerun resumes it), FAILED (its line a warning);
  [(name, closing line)]."""
  status = "FAILED" if failed else "KILLED" if stopped else "FINISHED"
  closed = []
  for tracker in built:
    line = tracker.close(durable, status=status,
                         figures=figures if status == "FINISHED" else None)
    if failed:
      logging.warning("%s: %s", tracker.name, line)
    closed.append((tracker.name, line))
  return closed
