"""Split names: 'train', 'test[:8000]', 'train[10%:90%]', and which field names one.

Synopsis::

    name, start, stop = splits.parse_split("test[8000:]")  # 'test', 8000, None
    name, rows = splits.split_slice("train[:90%]", 60_000)  # 'train', slice
    field = splits.split_field(config, split)          # 'data.train_split'

An experiment's `dataset_fn(config, split)` gets the split string as
configured; `split_slice` turns it into rows once the loader knows the
size. Errors name the config field that holds the split.
"""

import re

from looper.errors import ConfigError

# A split is a name with an optional TFDS-style slice: 'train', 'test[:8000]',
# 'test[8000:]', 'train[10%:90%]'.
_SPLIT_RE = re.compile(r"^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")


def split_field(config, split: str) -> str:
  """The config field that names `split`: the train split's, else the eval
  split's (a split used for both is the train split)."""
  return ("data.train_split" if split == config.data.train_split
          else "data.eval_split")


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
