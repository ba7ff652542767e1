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
best first by the sweep's objective: number, objective, state, step, wall
time and sampled values (from each trial's trial.json: looper.sweep.report).

The table fits `--width` (120) characters: the columns that matter least
are left out, and named in one line on stderr (a sweep's last sampled
values first, a run's goodput, then its metrics but the best's);
`--columns=a,b` picks columns by their titles (the name column always
first), `--columns=all` shows every one.

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
WIDTH = 120  # characters a table fits by default (--width)


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
    row = {"trial": str(record["number"]),
           record["objective"]: ("-" if record["value"] is None else
                                 formats.number(record["value"])),
           "state": record["state"]}
    row.update({k: run[k] for k in ("step", WALL) if k in run})
    row.update({k: formats.number(v) if isinstance(v, float) else str(v)
                for k, v in record["params"].items()})
    rows.append(row)
  return rows


def order(rows: list[dict[str, str]]) -> list[str]:
  """The columns of `rows` as the table shows them: in order of first
  appearance (a sweep's rows put theirs in order: `trial_rows`), except
  that a run's goodput and wall time come last (they describe the run, the
  rest its results)."""
  columns = []
  for row in rows:
    columns += [c for c in row if c not in columns]
  if "trial" in columns:
    return columns
  last = ("goodput", WALL)
  return sorted(columns, key=lambda c: last.index(c) + 1 if c in last else 0)


def _kept_first(columns: list[str]) -> list[str]:
  """`columns` by what matters most, kept first when the table must fit:
  the row's name; a sweep's objective, state, step and wall time, then
  its sampled values in order; a run's step and best, then its wall time
  and its metrics, goodput last."""
  if "trial" in columns:
    return columns  # trial_rows' own order is that
  head = ["run", "step", *[c for c in columns if c.startswith("best ")],
          WALL]
  return ([c for c in head if c in columns] +
          [c for c in columns if c not in head and c != "goodput"] +
          [c for c in columns if c == "goodput"])


def _widths(rows, columns) -> list[int]:
  return [max(len(c), *(len(row.get(c, "-")) for row in rows))
          for c in columns]


def fit(rows: list[dict[str, str]], width: int) -> tuple[list[str],
                                                          list[str]]:
  """(the columns shown, those left out): the most that matter
  (`_kept_first`) within `width` characters; at least the name and the
  first figure, however wide."""
  columns, dropped = order(rows), []
  for column in reversed(_kept_first(order(rows))[2:]):
    if sum(_widths(rows, columns)) + 3 * len(columns) + 1 <= width:
      break
    columns.remove(column)
    dropped.insert(0, column)
  return columns, dropped


def table(rows: list[dict[str, str]], columns: list[str] | None = None
          ) -> str:
  """A markdown table of `columns` (default: all, `order`), padded so it
  also reads as plain text."""
  columns = columns or order(rows)
  cells = [columns] + [[row.get(c, "-") for c in columns] for row in rows]
  widths = _widths(rows, columns)
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


FLAGS = flags.FlagValues()
flags.DEFINE_list("columns", None, "The columns to show, by their titles"
                  " (e.g. trial,eval/accuracy,model.width), or 'all';"
                  " default: those that matter most within --width.",
                  flag_values=FLAGS)
flags.DEFINE_integer("width", WIDTH, "Characters the table fits by default.",
                     flag_values=FLAGS)
USAGE = ("usage: looper runs WORKDIR_OR_PARENT... [--columns=a,b] [--width=N]"
         "\na workdir, or a directory of workdirs (one table of all)")


def _chosen(rows: list[dict[str, str]]) -> tuple[list[str], str | None]:
  """The columns --columns and --width choose, and the line that names
  what was left out (None: nothing) or an unknown column (exit 1)."""
  known = order(rows)
  if FLAGS.columns == ["all"]:
    return known, None
  if FLAGS.columns:
    unknown = [c for c in FLAGS.columns if c not in known]
    if unknown:
      raise ValueError(f"--columns: {unknown[0]!r} is no column of these runs;"
                       f" choose from {', '.join(known)}")
    return [known[0], *[c for c in FLAGS.columns if c != known[0]]], None
  columns, dropped = fit(rows, FLAGS.width)
  return columns, dropped and (
      f"{len(dropped)} column(s) left out to fit --width={FLAGS.width}:"
      f" {', '.join(dropped)}; show them with --columns=all or"
      " --columns=a,b")


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
    try:
      columns, note = _chosen(rows)
    except ValueError as e:
      print(f"looper runs: {e}", file=sys.stderr)
      return 1
    print(table(rows, columns))
    if note:
      print(f"looper runs: {note}", file=sys.stderr)
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
