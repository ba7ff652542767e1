"""`looper runs DIR...`: one table of runs, read from their metrics.jsonl.

Synopsis::

    looper runs /tmp/mnist /tmp/sweep/*     # or: python -m looper.cli.runs ...
    looper runs /tmp/sweep                  # the workdirs one level down
    looper runs gs://bucket/sweep           # read through tf.io.gfile

    | run          | step | accuracy | loss    | best accuracy | goodput | wall (all attempts) |
    |--------------|------|----------|---------|---------------|---------|---------------------|
    | /tmp/sweep/a | 1000 | 0.9741   | 0.08623 | 0.9741 @1000  | 81%     | 0:01:02             |
    | /tmp/sweep/b | 1000 | 0.9613   | 0.1302  | 0.9655 @800   | 64%     | 0:01:05             |

A sweep's folder (`looper sweep --workdir=DIR`) is one row per trial,
best first by the sweep's objective: number, state, objective, sampled
values, step and wall time (from each trial's trial.json: looper.sweep.report).

Otherwise one row per workdir (a directory holding `train/` or `eval/`), from its
`metrics.jsonl` (see `looper.workdir.jsonl`; no event file is read): the last
step, the last value of every eval metric (each eval set's as
`<set>/<metric>`), the best evaluation by `best.Best.of`
(`checkpoint.best_metric` from its config.json; else `accuracy`; else the
loss; of the monitor set) with its step, the goodput of its training
attempts and their wall time added up (from its goodput/ records:
looper.measure.goodput): each attempt from its process' start to its end,
the time between attempts (a stopped run waiting for its rerun) not
counted. It is the goodput line's `of 0:01:02 in 2 attempts` and, for a
run of one attempt, its closing line's `looper done: step 1000 in
0:01:02`. Metrics print as the log lines show them (a whole number in full,
others with 4 significant digits: looper.workdir.formats.number), `-`
where a run has none. A path that is no workdir
and holds none one level down, or a workdir without scalars yet, is named
in one line on stderr (exit status 1); the table shows the others.
"""

import datetime
import os
import sys

from absl import flags
import tensorflow as tf

from looper import workdir as workdir_lib
from looper.cli import parsing
from looper.data import splits
from looper.options import best
from looper.measure import goodput
from looper.workdir import files
from looper.workdir import jsonl
from looper.workdir import formats

# What an eval line holds beside its metrics (and each set's
# '<set>/examples'): not a column.
_NOT_METRICS = ("kind", "step", "time", "examples")
# The column of the training attempts' wall time, added up (module doc).
WALL = "wall (all attempts)"


def is_workdir(path: str) -> bool:
  wd = workdir_lib.Workdir(path)
  return any(tf.io.gfile.isdir(d) for d in (wd.train_events, wd.eval_events))


def workdirs(path: str) -> list[str]:
  """`path` if it is a workdir, else the workdirs one level down."""
  if is_workdir(path):
    return [path]
  # An object store lists a folder with a trailing slash.
  names = sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path))
  return [os.path.join(path, name) for name in names
          if is_workdir(os.path.join(path, name))]


def _identity(path: str) -> str:
  """One spelling per workdir, to show it once however it was named."""
  if workdir_lib.posix(path):
    return os.path.realpath(path)
  return path.rstrip("/")


def summarize(workdir: str) -> dict[str, str] | None:
  """One row of the table, {column: cell}; None if no loop was logged."""
  wd = workdir_lib.Workdir(workdir)
  lines = jsonl.read(wd.metrics)
  logged = [l for l in lines if l["kind"] in ("train", "eval")]
  if not logged:
    return None
  row = {"run": workdir, "step": str(max(l["step"] for l in logged))}
  evals = [l for l in logged if l["kind"] == "eval"]
  names = [k for k in evals[-1] if k not in _NOT_METRICS and
           not k.endswith("/examples")] if evals else []
  for name in sorted(names):
    row[name] = formats.number(evals[-1][name])
  # No config.json, or unreadable: the defaults.
  saved = files.read_json(wd.config) or {}
  rule = best.Best.of(saved.get("checkpoint", {}), names,
                      splits.monitor_set(saved))
  top = rule.first_best((l["step"], l[rule.metric]) for l in evals
                        if rule.metric in l)
  if rule.metric in names and top:
    row[f"best {rule.metric}"] = f"{formats.number(top[1])} @{top[0]}"
  attempts = goodput.read(wd)
  if attempts:
    totals = goodput.Totals.of(attempts)
    row["goodput"] = f"{totals.goodput:.0%}"
    row[WALL] = str(datetime.timedelta(seconds=round(totals.wall)))
  return row


def trial_rows(path: str) -> list[dict[str, str]] | None:
  """The rows of a sweep's trials (`looper sweep --workdir=path`), best
  first by its objective; None if `path` holds no sweep."""
  folder = os.path.join(path, "trials")
  if not tf.io.gfile.isdir(folder):
    return None
  found = []
  for name in tf.io.gfile.listdir(folder):
    record = files.read_json(os.path.join(folder, name.rstrip("/"),
                                          "trial.json"))
    if record:
      found.append((record, os.path.join(folder, name.rstrip("/"))))
  if not found:
    return None
  sign = -1 if found[0][0]["direction"] == "maximize" else 1
  found.sort(key=lambda f: (f[0]["value"] is None,
                            sign * (f[0]["value"] or 0), f[0]["number"]))
  rows = []
  for record, trial in found:
    run = summarize(trial) or {}
    row = {"trial": str(record["number"]), "state": record["state"],
           record["objective"]: ("-" if record["value"] is None else
                                 formats.number(record["value"]))}
    row.update({k: formats.number(v) if isinstance(v, float) else str(v)
                for k, v in record["params"].items()})
    row.update({k: run[k] for k in ("step", WALL) if k in run})
    rows.append(row)
  return rows


def table(rows: list[dict[str, str]]) -> str:
  """A markdown table, padded so it also reads as plain text."""
  columns = []
  for row in rows:  # in order of first appearance: run, step, metrics, ...
    columns += [c for c in row if c not in columns]
  # The goodput and wall time last: they describe the run, the rest its
  # results.
  last = ("goodput", WALL)
  columns.sort(key=lambda c: last.index(c) + 1 if c in last else 0)
  cells = [columns] + [[row.get(c, "-") for c in columns] for row in rows]
  widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
  lines = ["| " + " | ".join(v.ljust(w) for v, w in zip(line, widths)) + " |"
           for line in cells]
  lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
  return "\n".join(lines)


def _collect(path: str, seen: set[str]) -> tuple[list[dict[str, str]],
                                                 list[str]]:
  """(rows, problems) of one command-line path; skips workdirs in `seen`."""
  if not tf.io.gfile.isdir(path):
    return [], [f"{path} is not a directory" if tf.io.gfile.exists(path)
                else f"{path} does not exist"]
  trials = trial_rows(path)
  if trials is not None:
    return trials, []
  found = workdirs(path)
  if not found:
    return [], [f"{path} holds no looper workdir (train/ or eval/), here or"
                " one level down"]
  rows, problems = [], []
  for workdir in found:
    if _identity(workdir) in seen:  # named twice (itself and parent)
      continue
    seen.add(_identity(workdir))
    row = summarize(workdir)
    if row is None:
      metrics = os.path.basename(workdir_lib.Workdir(workdir).metrics)
      problems.append(f"{workdir} has no train loop or evaluation in"
                      f" {metrics} yet")
    else:
      rows.append(row)
  return rows, problems


FLAGS = flags.FlagValues()  # none but --help; absl like every looper tool
USAGE = ("usage: looper runs WORKDIR_OR_PARENT...\n"
         "a workdir, or a directory of workdirs (one table of all)")


def main(argv=None) -> int:
  """`looper runs DIR...`; returns the exit code."""
  dirs = parsing.parse_tool_flags(argv, FLAGS, USAGE,
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
