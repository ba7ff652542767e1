"""`workdir/metrics.jsonl`: one JSON line per train loop and per evaluation.

Synopsis::

    log = jsonl.MetricsLog(workdir.metrics)    # a training run's chief
    log.start()                                # a fresh run: a new file
    log.write("train", step=100, logs={"loss": 0.3, "accuracy": 0.9, ...})
    log.write("eval", step=100, logs={"loss": 0.2, "accuracy": 0.93, ...})
    log.truncate_after(step)                   # a resume or a roll-back
    jsonl.read(workdir.metrics)                # the lines, as dicts
    jsonl.named(line)                          # {"train/loss": 0.3, ...}

    import pandas as pd
    pd.read_json("/tmp/mnist/metrics.jsonl", lines=True)   # a DataFrame

Each line is {"kind": "start" | "train" | "eval" | "action", "step": the
global step, "time": seconds since the epoch, then every logged value}.
Train lines hold the loop's mean loss (and the mean of each per-step
value a train_step returns beside it), the train metrics, learning_rate,
steps_per_sec, examples_per_sec, tokens_per_sec (sequences), flops_per_sec,
mfu and input_wait_fraction at the loop's
last step; eval lines every eval metric and `examples`; action lines the
scalars an action wrote (`Moment.writer`). Outside the run (experiment
trackers) the names are prefixed by kind, `named(line)`: `train/loss`,
`eval/loss`, an action's as it wrote them. The file is
written as the run goes (a line is flushed when written) and truncated on
resume exactly like the event files, so no step appears twice. `looper
runs` reads it. Only training runs write it (the chief); an evaluator
beside training writes only events.

On an object store (`workdir.posix` is False: gs://, s3://) an append
rewrites the whole object (GCS reads it back and uploads it again), so a
long run's file would be uploaded again at every line. There
`metrics.jsonl` is a folder of parts `<N>.jsonl` of at most PART_LINES
lines: a line replaces only the newest part, whole (no reader sees a part
of one), each run attempt starts a new part, and a truncation replaces
only the parts holding later steps. `read` joins them in number order
(zero-padded names: `gsutil cat` of the folder gives the same file).
"""

import json
import os
import time

import tensorflow as tf

from looper import workdir as workdir_lib
from looper.workdir import files

# Lines in a part: a write uploads at most this many (~30 KB).
PART_LINES = 100
# A line's names outside the run, where train and eval metrics share one
# namespace (a tracker's run): prefixed by the line's kind.
PREFIXES = {"train": "train/", "eval": "eval/", "action": ""}
NOT_VALUES = ("kind", "step", "time")


def named(line: dict) -> dict[str, float]:
  """The values of a train, eval or action line under their names outside
  the run (PREFIXES)."""
  return {PREFIXES[line["kind"]] + k: v for k, v in line.items()
          if k not in NOT_VALUES}


def read(path: str) -> list[dict]:
  """The lines of the metrics.jsonl at `path` (`Workdir.metrics`; [] if
  there is none); a last line cut short by a crash is skipped."""
  if tf.io.gfile.isdir(path):
    return [line for part in _parts(path) for line in _parse(part)[0]]
  return _parse(path)[0]


def _parse(path: str) -> tuple[list[dict], bool]:
  """(the whole lines of the file at `path`, whether that is all of it)."""
  if not tf.io.gfile.exists(path):
    return [], True
  out = []
  with tf.io.gfile.GFile(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except ValueError:  # a partial last line
        return out, False
  return out, True


def _parts(folder: str) -> list[str]:
  """The parts of the folder form, in number order (not by name: the
  numbers outgrow their zero padding)."""
  names = [n for n in tf.io.gfile.listdir(folder) if n.endswith(".jsonl")]
  return [os.path.join(folder, n)
          for n in sorted(names, key=lambda n: int(n.split(".")[0]))]


class MetricsLog:
  """Appends to the metrics.jsonl at `path` (see module doc)."""

  def __init__(self, path: str):
    self.path = path
    self._in_parts = not workdir_lib.posix(path)
    self._part = None  # in parts: the part this attempt writes...
    self._lines = []  # ...and its lines

  def start(self) -> None:
    """A run from step 0: what a killed attempt wrote is replaced."""
    line = _line("start", 0, {})
    if self._in_parts:
      if tf.io.gfile.exists(self.path):
        tf.io.gfile.rmtree(self.path)
      self._part = None
      self._append(line)
      return
    files.write_text(self.path, line)

  def write(self, kind: str, step: int, logs: dict[str, float]) -> None:
    line = _line(kind, step, logs)
    if self._in_parts:
      self._append(line)
      return
    files.append_text(self.path, line)

  def truncate_after(self, step: int) -> None:
    """Drops the lines of steps after `step` (and a line a crash cut
    short, which would glue itself to the next), atomically: the file, or
    each part holding any, replaced whole."""
    if not self._in_parts:
      _keep_up_to(self.path, step)
      return
    if tf.io.gfile.isdir(self.path):
      for part in _parts(self.path):
        if not _keep_up_to(part, step):
          tf.io.gfile.remove(part)
    self._part = None  # the resumed attempt writes a part of its own

  def _append(self, line: str) -> None:
    """Adds `line` to this attempt's part, a new one when it is full."""
    if self._part is None or len(self._lines) == PART_LINES:
      files.makedirs(self.path)
      parts = _parts(self.path)
      last = int(os.path.basename(parts[-1]).split(".")[0]) if parts else 0
      self._part = os.path.join(self.path, f"{last + 1:06d}.jsonl")
      self._lines = []
    self._lines.append(line)
    files.write_text(self._part, "".join(self._lines))


def _keep_up_to(path: str, step: int) -> bool:
  """Drops the lines of the file at `path` after `step`, and a cut one;
  whether any line is left."""
  lines, whole = _parse(path)
  kept = [l for l in lines if l["step"] <= step]
  if not whole or len(kept) < len(lines):
    files.write_text(path, "".join(json.dumps(l) + "\n" for l in kept))
  return bool(kept)


def _line(kind: str, step: int, logs: dict[str, float]) -> str:
  return json.dumps({"kind": kind, "step": int(step), "time": time.time(),
                     **{k: float(v) for k, v in logs.items()}}) + "\n"
