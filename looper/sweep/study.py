"""The study on Optuna: storage, sampler, pruner, and the checks of a reused study.

Synopsis::

    storage = study.open_storage(None, sweep_dir)   # DIR/study.db (SQLite)
    s = study.load(storage, "mnist-lr", spec, sampler="tpe", seed=0,
                   pruner="median", pruner_startup=5)
    trial = study.ask(s, spec["space"], sampler="tpe", seed=0)
    trial = study.trial_of(s, storage, 3)   # a left RUNNING trial's Trial

Storage (`--storage`): none is an SQLite file in the sweep's folder
(nothing to start); `postgresql://...` or any SQLAlchemy URL Optuna takes
is shared by workers on several machines (`postgresql://` is read with
psycopg 3, the `sweep` extra's driver); a path ending in `.journal` (or
`journal:PATH`) is Optuna's journal file, for a shared file system
without a database. A server that does not answer ends in one line after
`CONNECT_SECS`; two workers starting on an empty database both create
Optuna's tables (optuna#1092), so that is retried.

A seeded sampler is reseeded at each ask from (`--seed`, the trial's
number), so the values a trial gets depend on the seed, its number and the
study's history, not on how many asks a process made: a sweep killed and
rerun samples what an uninterrupted one does (with --parallel=1).
A study keeps its space, objective and direction in its user attributes;
the same name with another of them is refused in one line.
"""

import json
import time

import optuna

from looper.errors import ConfigError

CONNECT_SECS = 10
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "successive_halving", "none")
_ATTRS = ("space", "objective", "direction")

optuna.logging.set_verbosity(optuna.logging.WARNING)


def storage_url(storage: str | None, sweep_dir: str) -> str:
  if not storage:
    return f"sqlite:///{sweep_dir}/study.db"
  if storage.startswith("postgresql://"):  # SQLAlchemy's default: psycopg2
    return "postgresql+psycopg://" + storage[len("postgresql://"):]
  return storage


def open_storage(storage: str | None, sweep_dir: str):
  """Optuna's storage for `--storage` (module doc); ConfigError if it
  does not answer."""
  if storage and (storage.endswith(".journal") or
                  storage.startswith("journal:")):
    from optuna.storages import journal  # pylint: disable=g-import-not-at-top
    path = storage[len("journal:"):] if storage.startswith("journal:") else (
        storage)
    return optuna.storages.JournalStorage(journal.JournalFileBackend(path))
  url = storage_url(storage, sweep_dir)
  kwargs = {}
  if url.startswith("postgresql"):
    kwargs = {"connect_args": {"connect_timeout": CONNECT_SECS}}
  elif url.startswith("sqlite"):  # workers of one folder wait their turn
    kwargs = {"connect_args": {"timeout": 60}}
  last = None
  for attempt in range(5):
    try:
      return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as e:  # pylint: disable=broad-exception-caught
      last = e
      if _unreachable(e):
        break
      time.sleep(0.2 * (attempt + 1))  # another worker creating tables
  first = str(last).strip().splitlines()[0] if str(last).strip() else repr(
      last)
  raise ConfigError(
      f"--storage={storage}: no answer or refused ({first}); check the URL"
      " and that the server runs and lets this machine in")


def _unreachable(e: Exception) -> bool:
  text = str(e).lower()
  return any(w in text for w in ("timeout", "timed out", "refused",
                                 "could not translate", "no such host",
                                 "password", "does not exist"))


def sampler_of(name: str, seed: int | None, space: dict):
  if name == "random":
    return optuna.samplers.RandomSampler(seed=seed)
  if name == "grid":
    return optuna.samplers.GridSampler(grid(space), seed=seed)
  return optuna.samplers.TPESampler(seed=seed)


def grid(space: dict) -> dict:
  """Every value of each field (--sampler=grid); ConfigError for a float
  range without a step."""
  values = {}
  for key, d in space.items():
    if d["type"] == "categorical":
      values[key] = d["choices"]
    elif d["step"] is None:
      raise ConfigError(
          f"--sampler=grid: space[{key!r}] is a continuous float range; give"
          " it a step (sweep.Float(low, high, step=...)) or a Categorical")
    else:
      n = int(round((d["high"] - d["low"]) / d["step"])) + 1
      values[key] = [d["low"] + i * d["step"] for i in range(n)]
  return values


def pruner_of(name: str, startup: int):
  if name == "median":
    return optuna.pruners.MedianPruner(n_startup_trials=startup)
  if name == "hyperband":
    return optuna.pruners.HyperbandPruner()
  if name == "successive_halving":
    return optuna.pruners.SuccessiveHalvingPruner()
  return optuna.pruners.NopPruner()


def load(storage, name: str, spec: dict, *, sampler: str, seed, pruner: str,
         pruner_startup: int) -> optuna.Study:
  """The study `name` (made if new), its space and objective checked
  against a reused one's (module doc)."""
  s = optuna.create_study(
      storage=storage, study_name=name, direction=spec["direction"],
      load_if_exists=True, sampler=sampler_of(sampler, seed, spec["space"]),
      pruner=pruner_of(pruner, pruner_startup))
  attrs = s.user_attrs
  if "looper" not in attrs:
    s.set_user_attr("looper", {k: spec[k] for k in _ATTRS})
    return s
  had = attrs["looper"]
  for key in _ATTRS:
    if json.dumps(had[key], sort_keys=True) != json.dumps(spec[key],
                                                          sort_keys=True):
      raise ConfigError(
          f"--study={name} already holds a sweep with another {key}"
          f" ({json.dumps(had[key])[:120]}); choose a new --study, or"
          " restore that sweep's get_sweep()")
  return s


def suggest(trial: optuna.Trial, space: dict) -> dict:
  """Samples every field of `space` for `trial`: {field: value}."""
  params = {}
  for key, d in space.items():
    if d["type"] == "categorical":
      params[key] = trial.suggest_categorical(key, d["choices"])
    elif d["type"] == "int":
      params[key] = trial.suggest_int(key, d["low"], d["high"], log=d["log"],
                                      step=1 if d["log"] else d["step"])
    else:
      params[key] = trial.suggest_float(key, d["low"], d["high"],
                                        log=d["log"], step=d["step"])
  return params


def reseed(s: optuna.Study, sampler: str, seed: int | None, number: int,
           space: dict) -> None:
  """The study's sampler, seeded from (seed, number) (module doc)."""
  if seed is not None:
    s.sampler = sampler_of(sampler, (seed * 1_000_003 + number) % 2**32,
                           space)


def ask(s: optuna.Study, space: dict, *, sampler: str, seed) -> tuple:
  """(a new trial, its values), sampled as the module doc says."""
  reseed(s, sampler, seed, len(s.get_trials(deepcopy=False)), space)
  trial = s.ask()
  reseed(s, sampler, seed, trial.number, space)  # another worker asked
  return trial, suggest(trial, space)


def trial_of(s: optuna.Study, storage, number: int) -> optuna.Trial:
  """The Trial of `s`'s trial `number`, to report to and tell (a RUNNING
  trial a dead worker left). Optuna makes Trials only inside ask() and
  optimize(), and a FrozenTrial's id is private (`_trial_id`): the id
  comes from the storage's public lookups, and the Trial from its public
  constructor, which Optuna's docs call not recommended, not private
  (tests/unit/sweep/test_study.py fails if that changes)."""
  study_id = storage.get_study_id_from_name(s.study_name)
  return optuna.Trial(
      s, storage.get_trial_id_from_study_id_trial_number(study_id, number))


def frozen(s: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
  """Trial `number` of `s` as the storage holds it now."""
  return next(t for t in s.get_trials(deepcopy=False) if t.number == number)


FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
            optuna.trial.TrialState.FAIL)
