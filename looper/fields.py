"""Declared config fields: a value with its kind and bounds, declared once; the checks of a block.

Synopsis (in a get_config(); `looper.config` re-exports these)::

    c.model.width = lc.whole(128)          # a whole number >= 1
    c.train.lease_secs = lc.seconds(60, positive=True)
    c.model.flip = lc.boolean(False)
    for path, field in fields.declared(c):  # what config.validate checks
      field.allows(field.get()), field.must

    # A block's owner checks it (optimizers.check, distribute.check, ...):
    fields.check_declared(block, "optimizer")   # each declared field
    fields.check(block.learning_rate > 0, "optimizer.learning_rate",
                 block.learning_rate, "must be > 0")
    fields.check_choice(block.name, "optimizer.name", OPTIMIZERS)

A `Field` is an ml_collections FieldReference that keeps its bounds, so
`--config.x.y=v` is typed by it and `looper.config.validate` names the
bound a bad value breaks ("must be a whole number >= 1"). Every check
raises ConfigError in one line naming the field, the value and the fix.
"""

import difflib
from typing import Any

import ml_collections
from ml_collections import config_dict

from looper.errors import ConfigError


def whole_number(value: Any) -> bool:
  """An int that is not a bool (True would silently mean 1)."""
  return isinstance(value, int) and not isinstance(value, bool)


def number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


class Field(config_dict.FieldReference):
  """A declared field (`whole`, `seconds`, `boolean`): type and bounds.

  ml_collections keeps a FieldReference as the field itself: `c.x.y` reads
  its value, `c.x.y = v` and `--config.x.y=v` set it (typed by it), and
  the bounds stay for `validate` (also through deepcopy and pickle).
  `to_dict`, `references.to_json` and `copy_and_resolve_references` see only the
  value. A declaration assigned to a declared field would be linked to it
  (ml_collections' rule for references), the first bounds kept: declare a
  field once.
  """

  def __init__(self, default, field_type: type, noun: str = "",
               low: float = 0, above: bool = False, off: float | None = None):
    super().__init__(default, field_type=field_type)
    self._noun, self._low, self._above = noun, low, above
    self._off = off  # a value outside the bounds that turns the option off

  def __setstate__(self, state):  # FieldReference's restores its own only
    self.__dict__.update(state)

  @property
  def must(self) -> str:  # as validate's error says it
    if self.get_type() is bool:
      return "True or False"
    off = "" if self._off is None else f"{self._off:g} (off) or "
    return f"{off}{self._noun} {'>' if self._above else '>='} {self._low}"

  def allows(self, value: Any) -> bool:
    if self.get_type() is bool:
      return isinstance(value, bool)
    kind = whole_number if self.get_type() is int else number
    return kind(value) and (value == self._off or (
        value > self._low if self._above else value >= self._low))


def whole(default: int, low: int = 1) -> Field:
  """A whole number >= low (a bool is refused: True would mean 1)."""
  return Field(default, int, "a whole number", low)


def seconds(default: float, positive: bool = False) -> Field:
  """A number of seconds >= 0 (> 0 if `positive`)."""
  return Field(float(default), float, "a number of seconds", 0, positive)


def boolean(default: bool) -> Field:
  return Field(default, bool)


def epochs() -> Field:
  """A number of epochs >= 0, a fraction too; 0: counted in steps."""
  return Field(0.0, float, "a number of epochs")


def declared(c: ml_collections.ConfigDict, prefix: str = ""):
  """Yields (dotted path, Field) for each declared field of `c`, nested
  blocks too, in ml_collections' (sorted) key order."""
  for key, field in c.items(preserve_field_references=True):
    if isinstance(field, Field):
      yield prefix + key, field
    elif isinstance(field, ml_collections.ConfigDict):
      yield from declared(field, f"{prefix}{key}.")


def object_field(default):
  # A field that holds a callable, a class or a 'module:name' string. Without
  # field_type=object ml_collections would fix its type at the first value.
  return config_dict.FieldReference(default, field_type=object)


def check(ok: bool, field: str, value: Any, fix: str) -> None:
  """Raises ConfigError 'config.FIELD=VALUE: FIX' unless `ok`."""
  if not ok:
    raise ConfigError(f"config.{field}={value!r}: {fix}")


def check_choice(value: Any, field: str, choices, also: str = "") -> None:
  """`value` must be one of `choices` (a table's keys); else one line with
  the nearest name (and `also`, another way to set the field)."""
  choices = list(choices)
  if value not in choices:
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"config.{field}={value!r} is not one of {', '.join(choices)};"
        f" {hint}set --config.{field}{also}")


def check_declared(c: ml_collections.ConfigDict, prefix: str = "") -> None:
  """Each declared field of `c` (a block at `prefix`: 'optimizer') holds a
  value its declaration allows."""
  for path, field in declared(c, f"{prefix}." if prefix else ""):
    value = field.get()
    check(field.allows(value), path, value,
          f"must be {field.must}; set --config.{path}")
