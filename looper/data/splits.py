"""Split names ('train', 'test[:8000]'), the field naming one, and the eval sets.

Synopsis::

    name, start, stop = splits.parse_split("test[8000:]")  # 'test', 8000, None
    name, rows = splits.split_slice("train[:90%]", 60_000)  # 'train', slice
    field = splits.split_field(config, split)          # 'data.train_split'
    splits.eval_sets(config)        # {'test': 'test[50%:]', 'val': 'test[:50%]'}
    splits.sets_of(config.data), splits.field_of(config.data, split)  # alike
    splits.metric_name("val", "accuracy")              # 'val/accuracy'
    splits.monitor_set(config)      # 'val': the set Keras callbacks see
    splits.set_logs(eval_logs, "val")                  # {'accuracy': ...}

An experiment's `dataset_fn(config, split)` gets the split string as
configured; `split_slice` turns it into rows once the loader knows the
size. Errors name the config field that holds the split.

Eval sets: `data.eval_splits = {"val": "test[:50%]", "test": "test[50%:]"}`
evaluates each split exactly, in name order (ml_collections keeps a
config's dicts by name: a copied config has lost the order they were
written in), and names its metrics `<set>/<metric>` ('val/accuracy',
'val/examples') everywhere a metric goes. Without it `data.eval_split` is
one set whose name is '' and whose metrics keep their bare names. The
monitor set (`eval.monitor_set`; by default 'val' if a set has that name,
else the first) is the one Keras callbacks see as `val_<metric>`, and the
one a run without `checkpoint.best_metric` is ranked by.
"""

import re
from typing import Mapping

from looper.errors import ConfigError

# A split is a name with an optional TFDS-style slice: 'train', 'test[:8000]',
# 'test[8000:]', 'train[10%:90%]'.
_SPLIT_RE = re.compile(r"^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")
# An eval set's name: a word, so `<set>/<metric>` reads one way back.
_SET_RE = re.compile(r"^[A-Za-z0-9_-]+$")
# What data.eval_split may hold when data.eval_splits replaces it: its
# default (looper.config's), or nothing.
_UNSET_EVAL_SPLIT = ("", "test")


def split_field(config, split: str) -> str:
  """The config field that names `split`: the train split's, else the eval
  set's (a split used for both is the train split)."""
  return field_of(config["data"], split)


def field_of(data: Mapping, split: str) -> str:
  """`split_field` of the `data` block alone."""
  if split == data["train_split"]:
    return "data.train_split"
  for name, value in sets_of(data).items():
    if name and value == split:
      return f"data.eval_splits[{name!r}]"
  return "data.eval_split"


def eval_sets(config: Mapping) -> dict[str, str]:
  """{set name: split} of `config` (a ConfigDict, or config.json's dict):
  data.eval_splits by name, else {'': data.eval_split} (see module doc)."""
  return sets_of(config.get("data") or {})


def sets_of(data: Mapping) -> dict[str, str]:
  """`eval_sets` of the `data` block alone."""
  if data.get("eval_splits"):
    return dict(sorted(data["eval_splits"].items()))
  return {"": data.get("eval_split", "test")}


def metric_name(eval_set: str, metric: str) -> str:
  """What `metric` of `eval_set` logs as: '<set>/<metric>', or the bare
  name for the one set of data.eval_split."""
  return f"{eval_set}/{metric}" if eval_set else metric


def set_logs(logs: Mapping[str, float], eval_set: str) -> dict[str, float]:
  """The eval logs of `eval_set` by their bare names ('accuracy')."""
  if not eval_set:
    return dict(logs)
  prefix = f"{eval_set}/"
  return {k[len(prefix):]: v for k, v in logs.items() if k.startswith(prefix)}


def monitor_set(config: Mapping) -> str:
  """The eval set Keras callbacks see as `val_<metric>` (module doc)."""
  sets = list(eval_sets(config))
  chosen = (config.get("eval") or {}).get("monitor_set", "")
  return chosen or ("val" if "val" in sets else sets[0])


def check_eval_sets(data, chosen: str, outputs=()) -> None:
  """data.eval_split and data.eval_splits (of the `data` block `data`), and
  `chosen`, eval.monitor_set; `outputs`: the model's output names
  (config.loss' keys), whose train metrics log as '<output>/<metric>'.
  Raises ConfigError in one line."""
  sets = data.eval_splits
  if sets is None or (hasattr(sets, "items") and not sets):
    parse_split(data.eval_split, "data.eval_split")
    if chosen:
      raise ConfigError(
          f"config.eval.monitor_set={chosen!r} names no eval set:"
          " config.data.eval_splits is not set; set --config.eval."
          "monitor_set='' or name the sets in config.data.eval_splits")
    return
  if not hasattr(sets, "items"):
    raise ConfigError(
        f"config.data.eval_splits={sets!r} is not a dict; give {{set name:"
        " split}, e.g. {'val': 'test[:50%]', 'test': 'test[50%:]'}")
  if data.eval_split not in _UNSET_EVAL_SPLIT:
    raise ConfigError(
        f"config.data.eval_split={data.eval_split!r} and config.data."
        "eval_splits both name the eval data; set one: add it to the sets"
        " and set --config.data.eval_split=''")
  for name, split in sets.items():
    if not (isinstance(name, str) and _SET_RE.match(name)):
      raise ConfigError(
          f"config.data.eval_splits names a set {name!r}: its metrics"
          f" '{name}/<metric>' would not read back as one set's; name it"
          " with letters, digits, '_' or '-'")
    if name in outputs:
      raise ConfigError(
          f"config.data.eval_splits names a set {name!r}, as the model's"
          f" output {name!r} (config.loss): its metrics '{name}/<metric>'"
          " would collide with the output's train metrics; rename the set")
    parse_split(split, f"data.eval_splits[{name!r}]")
  if chosen and chosen not in sets:
    raise ConfigError(
        f"config.eval.monitor_set={chosen!r} is not one of the eval sets"
        f" ({', '.join(sorted(sets))}); set --config.eval.monitor_set")


def parse_split(split: str, field: str = "data.split"):
  """Parses 'name[start:stop]' into (name, start, stop); % bounds are kept.

  Returns:
    (name, start, stop) where start/stop are None, ints, or strings such as
    '10%' that `split_slice` turns into indices once the size is known.
  """
  match = _SPLIT_RE.match(split.strip()) if isinstance(split, str) else None
  if not match:
    raise ConfigError(
        f"config.{field}={split!r} is not a split; write 'train', "
        f"'test[:8000]', 'test[8000:]' or 'train[:90%]'")
  name, start, stop = match.groups()
  as_bound = lambda b: b if b is None or b.endswith("%") else int(b)
  return name, as_bound(start), as_bound(stop)


def split_slice(split: str, num_examples: int, field: str = "data.split"):
  """Returns (name, slice) of `split` over a set of `num_examples` examples."""
  name, start, stop = parse_split(split, field)

  def index(bound):
    if isinstance(bound, str):
      return int(round(num_examples * int(bound[:-1]) / 100))
    return bound

  selected = slice(index(start), index(stop))
  if not range(num_examples)[selected]:
    raise ConfigError(
        f"config.{field}={split!r} selects no examples of the {num_examples}"
        f" in {name!r}; widen the slice")
  return name, selected
