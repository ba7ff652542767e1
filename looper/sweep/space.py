"""A sweep's search space and objective, declared beside get_config, and checked.

Synopsis (an experiment file)::

    from looper import sweep

    def get_sweep():
      return sweep.Sweep(
          space={"optimizer.learning_rate": sweep.Float(1e-4, 0.3, log=True),
                 "model.width": sweep.Int(8, 64, step=8),
                 "optimizer.name": sweep.Categorical(("sgd", "adam"))},
          objective="eval/accuracy", direction="maximize")

    spec = space.check(get_sweep(), config)   # ConfigError: one line
    spec["space"]["model.width"]   # {"type": "int", "low": 8, "high": 64, ...}

A space maps config field paths (as `--config.` overrides name them) to
distributions: looper's `Float`, `Int`, `Categorical` here or Optuna's own
(`optuna.distributions.FloatDistribution` & co., read by their fields, so
this module imports no Optuna). `check` refuses, in one line each, a key
that is no field of the config (with did-you-mean), a key naming a block,
an empty or inverted range, a log scale reaching 0, a float range on an
int field, and an objective or direction that is no name. The result is
JSON (the sweep's parent, without TensorFlow, reads it from the child that
loaded the config: looper.sweep.spec).

The objective names a value of the eval lines of metrics.jsonl:
`eval/accuracy` (the one eval set's `accuracy`) or, with several eval sets,
`val/loss` (that set's loss) as looper runs' columns name them.
"""

import dataclasses
import difflib
from typing import Any

import ml_collections

from looper.errors import ConfigError

DIRECTIONS = ("maximize", "minimize")


@dataclasses.dataclass(frozen=True)
class Float:
  """A float in [low, high]: uniform, or uniform in log space (`log`), or
  on a grid of `step`."""
  low: float
  high: float
  log: bool = False
  step: float | None = None


@dataclasses.dataclass(frozen=True)
class Int:
  """An int in [low, high] (both included), every `step`, or log-uniform."""
  low: int
  high: int
  log: bool = False
  step: int = 1


@dataclasses.dataclass(frozen=True)
class Categorical:
  """One of `choices` (numbers, strings, booleans or None)."""
  choices: tuple


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What `get_sweep()` returns: the space, the eval metric to optimize
  (module doc) and whether to maximize or minimize it."""
  space: dict
  objective: str
  direction: str = "maximize"


def to_json(key: str, dist) -> dict:
  """`dist` (looper's or Optuna's) as {"type": "float"|"int"|"categorical",
  ...}; ConfigError if it is neither."""
  if hasattr(dist, "choices"):
    return {"type": "categorical", "choices": list(dist.choices)}
  kind = {"Float": "float", "FloatDistribution": "float", "Int": "int",
          "IntDistribution": "int"}.get(type(dist).__name__)
  if kind is None or not hasattr(dist, "low"):
    raise ConfigError(
        f"get_sweep: space[{key!r}] is {dist!r}; use looper.sweep.Float,"
        " Int or Categorical (or an Optuna distribution)")
  step = dist.step
  if kind == "int":
    step = int(step or 1)
  return {"type": kind, "low": dist.low, "high": dist.high,
          "log": bool(dist.log), "step": step}


def fields(config: ml_collections.ConfigDict, prefix: str = "") -> dict:
  """Every leaf field of `config` by its dotted path: {path: value}."""
  found = {}
  for name, value in config.items():
    path = f"{prefix}{name}"
    if isinstance(value, ml_collections.ConfigDict):
      found[path] = value  # a block: named so a key on it is told apart
      found.update(fields(value, f"{path}."))
    else:
      found[path] = value
  return found


def _check_range(key: str, d: dict) -> None:
  if d["type"] == "categorical":
    if not d["choices"]:
      raise ConfigError(f"get_sweep: space[{key!r}] has no choices; give at"
                        " least two")
    return
  if not d["low"] < d["high"]:
    what = "empty" if d["low"] == d["high"] else "inverted"
    raise ConfigError(
        f"get_sweep: space[{key!r}] range [{d['low']:g}, {d['high']:g}] is"
        f" {what}; give low < high")
  if d["log"] and d["low"] <= 0:
    raise ConfigError(
        f"get_sweep: space[{key!r}] is log-scaled from {d['low']:g}; a log"
        " scale needs low > 0 (e.g. 1e-5)")
  if d["log"] and d["type"] == "float" and d["step"] is not None:
    raise ConfigError(f"get_sweep: space[{key!r}] sets both log and step;"
                      " choose one")


def _check_key(key: str, d: dict, known: dict) -> None:
  if key not in known:
    close = difflib.get_close_matches(
        key, [k for k, v in known.items()
              if not isinstance(v, ml_collections.ConfigDict)], n=1)
    hint = (f"did you mean {close[0]!r}?" if close else
            "run looper describe --config=... to list the fields")
    raise ConfigError(f"get_sweep: space key {key!r} is no config field;"
                      f" {hint}")
  value = known[key]
  if isinstance(value, ml_collections.ConfigDict):
    raise ConfigError(f"get_sweep: space key {key!r} is a block of the"
                      " config; name one of its fields")
  if (d["type"] == "float" and isinstance(value, int) and
      not isinstance(value, bool)):
    raise ConfigError(
        f"get_sweep: space[{key!r}] samples floats for an int field"
        f" ({key}={value}); use looper.sweep.Int")


def check(sweep: Any, config: ml_collections.ConfigDict) -> dict:
  """The sweep as JSON {"space", "objective", "direction"}, checked against
  `config` (module doc); ConfigError names the first problem."""
  if not isinstance(sweep, Sweep):
    raise ConfigError(f"get_sweep() returned {type(sweep).__name__}; return"
                      " looper.sweep.Sweep(space=..., objective=...)")
  if not sweep.space:
    raise ConfigError("get_sweep: the space is empty; map at least one"
                      " config field to a distribution")
  known = fields(config)
  space = {}
  for key, dist in sweep.space.items():
    d = to_json(key, dist)
    _check_key(key, d, known)
    _check_range(key, d)
    space[key] = d
  if not isinstance(sweep.objective, str) or not sweep.objective.strip("/"):
    raise ConfigError(f"get_sweep: objective={sweep.objective!r}; name an"
                      " eval metric, e.g. 'eval/accuracy'")
  if sweep.direction not in DIRECTIONS:
    raise ConfigError(f"get_sweep: direction={sweep.direction!r}; use"
                      " 'maximize' or 'minimize'")
  return {"space": space, "objective": sweep.objective,
          "direction": sweep.direction}


def metric_key(objective: str) -> str:
  """The key of the eval lines of metrics.jsonl that `objective` names."""
  return objective[len("eval/"):] if objective.startswith("eval/") else (
      objective)


def override(key: str, value) -> str:
  """The command-line override that sets field `key` to `value`."""
  return f"--config.{key}={value!r}" if isinstance(value, float) else (
      f"--config.{key}={value}")


def swept_overrides(space: dict, argv: list[str]) -> list[str]:
  """The `--config.FIELD=` flags of `argv` that set a swept field."""
  return [a for a in argv if a.startswith("--config.") and
          a[len("--config."):].split("=", 1)[0] in space]
