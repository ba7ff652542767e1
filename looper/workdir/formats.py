"""How looper's lines show a logged value: counts whole, SI prefixes.

Synopsis::

    formats.number(10000.0)   # '10000' (a count); 0.31264: '0.3126'
    formats.format_logs({"loss": 0.3126, "examples": 10000})
    formats.si(14.2e9)        # ('14.2', 'G')
    formats.flops(14.2e9)     # '14.2 GFLOP/s'
    formats.speed(logs)       # '5.12 steps/s, 21k tokens/s, 14.2 GFLOP/s ...'

One formatter for the progress and eval lines (looper.workdir.summaries),
the run's closing summary (looper.console) and `looper runs`.
"""


def number(value: float) -> str:
  """A logged value as the lines show it: a whole number (a count:
  examples, tokens) in full, 10000 and not 1e+04; any other to 4
  significant digits."""
  value = float(value)
  # Up to 2**53 every whole float64 is exact: a count, not a rounding.
  if value.is_integer() and abs(value) <= 2**53:
    return str(int(value))
  return f"{value:.4g}"


def format_logs(logs: dict[str, float]) -> str:
  """'loss=0.3126 examples=10000 accuracy=0.9051'."""
  return " ".join(f"{k}={number(v)}" for k, v in logs.items())


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


def speed(logs: dict[str, float]) -> str:
  """The speed part of the progress line, of what `logs` holds: '5.12
  steps/s, 21k tokens/s, 14.2 GFLOP/s = 4.38% MFU' (tokens for sequences,
  else examples)."""
  parts = [f"{''.join(si(logs['steps_per_sec']))} steps/s"]
  for count in ("tokens", "examples"):
    if f"{count}_per_sec" in logs:
      parts.append(f"{''.join(si(logs[count + '_per_sec']))} {count}/s")
      break
  if "flops_per_sec" in logs:
    mfu = f" = {100 * logs['mfu']:.3g}% MFU" if "mfu" in logs else ""
    parts.append(f"{flops(logs['flops_per_sec'])}{mfu}")
  return ", ".join(parts)
