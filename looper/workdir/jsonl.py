"""`workdir/metrics.jsonl`: one JSON line per train loop and per evaluation.

Synopsis::

    log = jsonl.MetricsLog(workdir.metrics)    # a training run's chief
    log.start()                                # a fresh run: a new file
    log.write("train", step=100, logs={"loss": 0.3, "accuracy": 0.9, ...})
    log.write("eval", step=100, logs={"loss": 0.2, "accuracy": 0.93, ...})
    log.truncate_after(step)                   # a resume or a roll-back
    jsonl.read(workdir.metrics)                # the lines, as dicts

    import pandas as pd
    pd.read_json("/tmp/mnist/metrics.jsonl", lines=True)   # a DataFrame

Each line is {"kind": "start" | "train" | "eval", "step": the global step,
"time": seconds since the epoch, then every logged value}. Train lines
hold the loop's mean loss, the train metrics, learning_rate,
steps_per_sec, examples_per_sec and input_wait_fraction at the loop's
last step; eval lines every eval metric and `examples`. The file is
written as the run goes (a line is flushed when written) and truncated on
resume exactly like the event files, so no step appears twice. `looper
runs` reads it. Only training runs write it (the chief); an evaluator
beside training writes only events.
"""

import json
import time

import tensorflow as tf


def read(path: str) -> list[dict]:
  """The lines of the metrics.jsonl at `path` (`Workdir.metrics`; [] if
  there is none); a last line cut short by a crash is skipped."""
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


class MetricsLog:
  """Appends to the metrics.jsonl at `path` (see module doc)."""

  def __init__(self, path: str):
    self.path = path

  def start(self) -> None:
    """A run from step 0: what a killed attempt wrote is replaced."""
    with tf.io.gfile.GFile(self.path, "w") as f:
      f.write(_line("start", 0, {}))

  def write(self, kind: str, step: int, logs: dict[str, float]) -> None:
    with tf.io.gfile.GFile(self.path, "a") as f:
      f.write(_line(kind, step, logs))

  def truncate_after(self, step: int) -> None:
    """Drops the lines of steps after `step` (and a line a crash cut
    short, which would glue itself to the next), atomically."""
    lines, whole = _parse(self.path)
    kept = [l for l in lines if l["step"] <= step]
    if whole and len(kept) == len(lines):
      return
    tmp = self.path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write("".join(json.dumps(l) + "\n" for l in kept))
    tf.io.gfile.rename(tmp, self.path, overwrite=True)


def _line(kind: str, step: int, logs: dict[str, float]) -> str:
  return json.dumps({"kind": kind, "step": int(step), "time": time.time(),
                     **{k: float(v) for k, v in logs.items()}}) + "\n"
