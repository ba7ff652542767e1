"""How looper's lines show a logged value: counts whole, SI prefixes.

Synopsis::

    formats.number(10000.0)   # '10000' (a count); 0.31264: '0.3126'
    formats.si(14.2e9)        # ('14.2', 'G')
    formats.flops(14.2e9)     # '14.2 GFLOP/s'
    formats.figure(0.008616)  # '0.008616'; 0.262: '0.2620'; 1.0: '1.000';
                              # 2000.0 (a count): '2000'
    formats.exponent(9.755e-4)  # '9.755e-4' (a learning rate)
    formats.rate(4012.0)      # '4.01k'

`number` for `looper runs`' table; the rest for the train and eval lines
(looper.workdir.lines) and the run's closing summary (looper.console).
The lines' figures (`figure`, `exponent`) keep 4 significant digits,
trailing zeros included, in at most WIDTH columns for 0 and any value
from 1e-9 to 1e10: right-aligned in WIDTH, a figure sits in the same
columns on every line.
"""

import math
import re

# The columns of a figure on the lines: 4 significant digits of a value
# from 1e-9 to 1e10 ('0.008616', '9.755e-4'; Python's '1.235e+05' is 9).
WIDTH = 8


def number(value: float) -> str:
  """A logged value as `looper runs` shows it: a whole number (a count:
  examples, tokens) in full, 10000 and not 1e+04; any other to 4
  significant digits."""
  value = float(value)
  # Up to 2**53 every whole float64 is exact: a count, not a rounding.
  if value.is_integer() and abs(value) <= 2**53:
    return str(int(value))
  return f"{value:.4g}"


def _short_exponent(text: str) -> str:
  """'9.755e-04' as '9.755e-4', '1.235e+05' as '1.235e5'."""
  return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m.group(1).strip("+") +
                m.group(2), text)


def figure(value: float) -> str:
  """A value as the lines show it, in WIDTH columns (module doc): a
  whole number from 10 on in full (a count), and 0 as '0'; else 4
  significant digits, trailing zeros kept ('0.2620' beside '0.008616',
  an accuracy of 1 as '1.000' under '0.9844'), in an exponent below 0.001
  and from 10000 on ('1.234e-5', '1.235e5')."""
  value = float(value)
  if not math.isfinite(value) or value == 0 or (
      value.is_integer() and 10 <= abs(value) <= 2**53):
    return number(value)
  if 1e-3 <= abs(value) < 9999.5:
    return f"{value:#.4g}".rstrip(".")
  return exponent(value)


def exponent(value: float) -> str:
  """4 significant digits in an exponent form (WIDTH columns, module doc):
  '9.755e-4', '1.000e-3' (a learning rate); 0 as '0'."""
  value = float(value)
  if value == 0 or not math.isfinite(value):
    return number(value)
  return _short_exponent(f"{value:.3e}")


def rate(value: float) -> str:
  """3 significant digits, trailing zeros kept, and an SI prefix: '50.7',
  '4.00k', '101' (at most 5 columns from 0.1 on)."""
  power = 0
  while abs(value) >= 999.5 and power < 6:
    value, power = value / 1000, power + 1
  return f"{value:#.3g}".rstrip(".") + " kMGTPE"[power].strip()


def si(value: float) -> tuple[str, str]:
  """`value` to 3 digits and its SI prefix: ('21', 'k'), ('14.2', 'G')."""
  power = 0
  while abs(value) >= 999.5 and power < 6:
    value, power = value / 1000, power + 1
  return f"{value:.3g}", " kMGTPE"[power].strip()


def flops(flops_per_sec: float) -> str:
  """'14.2 GFLOP/s'."""
  value, prefix = si(flops_per_sec)
  return f"{value} {prefix}FLOP/s"
