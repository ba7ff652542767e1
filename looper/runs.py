"""`looper runs DIR...`: one table of runs, read from their event files.

Synopsis::

    looper runs /tmp/mnist /tmp/sweep/*     # or: python -m looper.runs ...
    looper runs /tmp/sweep                  # the workdirs one level down

    | run          | step | accuracy | loss    | best accuracy | wall time |
    |--------------|------|----------|---------|---------------|-----------|
    | /tmp/sweep/a | 1000 | 0.9741   | 0.08623 | 0.9741 @1000  | 0:01:02   |
    | /tmp/sweep/b | 1000 | 0.9613   | 0.1302  | 0.9655 @800   | 0:01:05   |

One row per workdir (a directory holding `train/` or `eval/`): the last
step, the last value of every eval metric, the best value of
`checkpoint.best_metric` (from its config.json; else of `accuracy`) with
its step, and the time from the first event to the last (including any
time the run was stopped before a resume). Metrics print with 4
significant digits, `-` where a run has none. A path that is no workdir
and holds none one level down, or a workdir without scalars yet, is named
in one line on stderr (exit status 1); the table shows the others.
"""

import datetime
import json
import os
import sys

from absl import flags
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from looper import flag_errors

# Event directories of a workdir (run.py, summaries.py).
TRAIN, EVAL = "train", "eval"
# Eval scalars that count rather than measure: not a column.
_COUNTS = ("examples",)


def _read(logdir: str) -> tuple[dict[str, list[tuple[int, float]]],
                                list[float]]:
  """({scalar tag: [(step, value)] in step order}, wall times) of a logdir.

  The wall times are those of its first event (the writer opening, as the
  run starts) and of its last scalar; none if it holds no scalar.
  """
  if not os.path.isdir(logdir):  # e.g. no eval/ after --mode=train
    return {}, []
  acc = event_accumulator.EventAccumulator(
      logdir, size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  series, last = {}, []
  for tag in acc.Tags()["tensors"]:
    events = acc.Tensors(tag)
    values = [tensor_util.make_ndarray(e.tensor_proto) for e in events]
    if all(v.shape == () and v.dtype.kind == "f" for v in values):  # scalars
      series[tag] = sorted((e.step, float(v)) for e, v in zip(events, values))
      last.append(max(e.wall_time for e in events))
  return series, [acc.FirstEventTimestamp(), max(last)] if last else []


def is_workdir(path: str) -> bool:
  return any(os.path.isdir(os.path.join(path, d)) for d in (TRAIN, EVAL))


def workdirs(path: str) -> list[str]:
  """`path` if it is a workdir, else the workdirs one level down."""
  if is_workdir(path):
    return [path]
  return [os.path.join(path, name) for name in sorted(os.listdir(path))
          if is_workdir(os.path.join(path, name))]


def _best_metric(workdir: str) -> tuple[str, str]:
  """(metric, 'max' | 'min') to rank evaluations by."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      checkpoint = json.load(f).get("checkpoint", {})
  except (OSError, ValueError):  # no or unreadable config: the default
    checkpoint = {}
  if checkpoint.get("best_metric"):
    return checkpoint["best_metric"], checkpoint.get("best_mode", "max")
  return "accuracy", "max"


def summarize(workdir: str) -> dict[str, str] | None:
  """One row of the table, {column: cell}; None if no scalar was written."""
  train, train_times = _read(os.path.join(workdir, TRAIN))
  evals, eval_times = _read(os.path.join(workdir, EVAL))
  if not (train or evals):
    return None
  row = {"run": workdir, "step": str(max(
      series[-1][0] for series in [*train.values(), *evals.values()]))}
  for tag in sorted(evals):
    if tag not in _COUNTS:
      row[tag] = f"{evals[tag][-1][1]:.4g}"
  metric, mode = _best_metric(workdir)
  if metric in evals:
    pick = max if mode == "max" else min
    step, value = pick(evals[metric], key=lambda e: e[1])
    row[f"best {metric}"] = f"{value:.4g} @{step}"
  times = train_times + eval_times
  row["wall time"] = str(datetime.timedelta(
      seconds=round(max(times) - min(times))))
  return row


def table(rows: list[dict[str, str]]) -> str:
  """A markdown table, padded so it also reads as plain text."""
  columns = []
  for row in rows:  # in order of first appearance: run, step, metrics, ...
    columns += [c for c in row if c not in columns]
  # The wall time last: it describes the run, the rest its results.
  columns.sort(key=lambda c: c == "wall time")
  cells = [columns] + [[row.get(c, "-") for c in columns] for row in rows]
  widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
  lines = ["| " + " | ".join(v.ljust(w) for v, w in zip(line, widths)) + " |"
           for line in cells]
  lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
  return "\n".join(lines)


def _collect(path: str, seen: set[str]) -> tuple[list[dict[str, str]],
                                                 list[str]]:
  """(rows, problems) of one command-line path; skips workdirs in `seen`."""
  if not os.path.isdir(path):
    return [], [f"{path} is not a directory" if os.path.exists(path) else
                f"{path} does not exist"]
  found = workdirs(path)
  if not found:
    return [], [f"{path} holds no looper workdir (train/ or eval/), here or"
                " one level down"]
  rows, problems = [], []
  for workdir in found:
    if os.path.realpath(workdir) in seen:  # named twice (itself and parent)
      continue
    seen.add(os.path.realpath(workdir))
    row = summarize(workdir)
    if row is None:
      problems.append(f"{workdir} has no train or eval scalars yet")
    else:
      rows.append(row)
  return rows, problems


FLAGS = flags.FlagValues()  # none but --help; absl like every looper tool
USAGE = ("usage: looper runs WORKDIR_OR_PARENT...\n"
         "a workdir, or a directory of workdirs (one table of all)")


def main(argv=None) -> int:
  """`looper runs DIR...`; returns the exit code."""
  dirs = flag_errors.parse_tool_flags(argv, FLAGS, USAGE,
                                      "give at least one DIR")
  rows, problems, seen = [], [], set()
  for path in dirs:
    found, missing = _collect(path, seen)
    rows += found
    problems += missing
  for problem in problems:
    print(f"looper runs: {problem}", file=sys.stderr)
  if rows:
    print(table(rows))
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
