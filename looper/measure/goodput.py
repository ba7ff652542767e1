"""Goodput: where each training attempt's time went, across restarts.

Synopsis::

    ledger = goodput.Ledger(wd, started=time.monotonic())  # the chief's
    ledger.start(step)      # training starts (or resumes) at `step`
    ledger.loop(first_step=301, steps=100, seconds=0.31, input_wait=0.02)
    ledger.add("eval", 0.8)       # an action's time; see CATEGORIES
    totals = ledger.write()       # the record, at most every WRITE_SECS
    ledger.close("finished")      # the last record: how the attempt ended
    ledger.close(goodput.how_it_ended(run_result))  # the same, from a result
    ledger.close_failed(error)    # the same, failed: if the storage takes it
    ledger.wall                   # this attempt's wall time, as recorded
    goodput.Totals.of(goodput.read(wd)).line()
    # '81% of 0:01:02 in 2 attempts (largest loss: startup, 12%)'

An attempt is one training process of a run: the first start, each resume
after a kill -9, a preemption or a crash. Its record is
`goodput/attempt-<N>.json` in the workdir (Workdir.goodput_attempt),
replaced whole at most every WRITE_SECS and when it ends, so a killed
attempt keeps its time up to WRITE_SECS before the kill. Goodput, as
MaxText reports it, is the productive training time over the sum of every
attempt's wall time; the time between attempts (a scheduler restarting
the job) is no attempt's and is not counted.

An attempt's wall time, from its process' start (`looper.main`; a call of
`run.run` from Python: the call) to its last record, is split into
CATEGORIES, which sum to it:
  productive  train loops on steps no attempt had reached before, less
              the input wait and the compile time
  startup     from the start to the first train loop: imports, building,
              checks, restoring the checkpoint
  compile     the first train loop's time beyond its steps at the
              attempt's later rate: tracing and compiling the step
  recomputed  train loops on steps already trained, by an earlier attempt
              killed after its last checkpoint or before a NaN roll-back
  input_wait  train loops waiting for batches (`input_wait_fraction`; not
              measured under train.deterministic)
  eval        the evaluation actions (and the best checkpoint's save)
  checkpoint  checkpoint saves the loop waited for (an async save's wait)
  other       the rest: summaries, the progress line, the export, the
              controller between loops
"""

import dataclasses
import datetime
import os
import time

from absl import logging
import tensorflow as tf

from looper import errors
from looper import workdir as workdir_lib
from looper.workdir import files

CATEGORIES = ("productive", "startup", "compile", "recomputed", "input_wait",
              "eval", "checkpoint", "other")
# A record a second at most: a kill -9 loses less of its attempt's time
# than that, and an object store is written at most once a second.
WRITE_SECS = 1.0
# How a killed attempt's record ends: it never wrote another.
RUNNING = "running"


# Set by a process that imported ahead and waited for its run
# (looper.sweep.warm): the run's start-up begins at the hand-over.
handed_over: float | None = None


def process_started() -> float:
  """This process' start on the `time.monotonic()` clock (Linux: /proc);
  now where that cannot be read."""
  if handed_over is not None:
    return handed_over
  now = time.monotonic()
  try:
    # Not workdir files: the kernel's, read with `open` on every store.
    with open("/proc/self/stat", encoding="ascii") as f:
      # Field 22, starttime in clock ticks after boot; the name in field 2
      # may hold spaces: count from its closing parenthesis.
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime", encoding="ascii") as f:
      uptime = float(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return now
  return now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def how_it_ended(result: dict) -> str:
  """A training run's `ended` from its result (looper.run.run's)."""
  return (f"stopped by {result['stopped']}" if result.get("stopped") else
          f"ended early: {result['ended']}" if result.get("ended") else
          "finished")


def read(wd: workdir_lib.Workdir) -> list[dict]:
  """Every attempt's record in `wd`, in order; [] if none."""
  # Each is replaced whole: one that does not read is not expected.
  records = [files.read_json(path)
             for path in tf.io.gfile.glob(wd.goodput_attempt("*"))]
  return sorted((r for r in records if r is not None),
                key=lambda r: r["attempt"])


@dataclasses.dataclass
class Totals:
  """The records of a run's attempts, added up."""
  attempts: int
  wall: float
  seconds: dict[str, float]

  @classmethod
  def of(cls, records: list[dict]) -> "Totals":
    seconds = {c: sum(r["seconds"][c] for r in records) for c in CATEGORIES}
    return cls(len(records), sum(r["wall"] for r in records), seconds)

  def fractions(self) -> dict[str, float]:
    """'goodput' and each category's share of the wall time."""
    wall = max(self.wall, 1e-9)
    return {"goodput": self.seconds["productive"] / wall,
            **{c: self.seconds[c] / wall for c in CATEGORIES
               if c != "productive"}}

  @property
  def goodput(self) -> float:
    return self.fractions()["goodput"]

  @property
  def largest(self) -> tuple[str, float]:
    """The category that lost the most time, and its share."""
    losses = {k: v for k, v in self.fractions().items() if k != "goodput"}
    worst = max(losses, key=losses.get)
    return worst, losses[worst]

  def line(self) -> str:
    worst, share = self.largest
    attempts = f"{self.attempts} attempt{'s' * (self.attempts != 1)}"
    return (f"{self.goodput:.0%} of"
            f" {datetime.timedelta(seconds=round(self.wall))} in {attempts}"
            f" (largest loss: {worst}, {share:.0%})")


@dataclasses.dataclass
class _Loops:
  """Train loops added up."""
  busy: float = 0.0  # seconds not waiting for input
  steps: int = 0
  recomputed: float = 0.0  # seconds of `busy` on recomputed steps

  def add(self, busy: float, steps: int, recomputed: int) -> None:
    self.busy += busy
    self.steps += steps
    self.recomputed += busy * recomputed / steps


class Ledger:
  """Accounts one attempt's time (see module doc); the chief's only.

  Args:
    wd: the run's Workdir: the earlier attempts' records are read from it.
    started: the attempt's start on `clock`.
    clock: `time.monotonic`, injectable for tests.
  """

  def __init__(self, wd: workdir_lib.Workdir, *, started: float,
               clock=time.monotonic):
    self._wd = wd
    self._earlier = read(wd)
    self._clock = clock
    self._started = started
    self._record = {
        "attempt": 1 + max((r["attempt"] for r in self._earlier), default=0),
        "started_at": time.time() - (clock() - started),
        "first_step": None, "reached": None, "steps": 0,
        "recomputed_steps": 0, "ended": RUNNING}
    # Steps up to here were trained before: by an earlier attempt, or by
    # this one before a NaN roll-back.
    self._trained = max((r["reached"] or 0 for r in self._earlier),
                        default=0)
    self._seconds = dict.fromkeys(CATEGORIES, 0.0)
    # The first loop; the later ones of its length (the steady rate: not
    # the short loops before an eval or of a profiler window); all.
    self._first, self._like, self._all = None, _Loops(), _Loops()
    self._written = None
    self.wall = 0.0  # this attempt's wall time in its last record

  def start(self, step: int) -> None:
    """Training starts at `step`: the start-up ends (once)."""
    if self._record["first_step"] is None:
      self._record["first_step"] = step
      self._seconds["startup"] = self._clock() - self._started

  def loop(self, first_step: int, steps: int, seconds: float,
           input_wait: float = 0.0) -> None:
    """A train loop of `steps` steps from `first_step`, `seconds` long,
    `input_wait` of it waiting for data (a fraction)."""
    last = first_step + steps - 1
    recomputed = max(0, min(last, self._trained) - first_step + 1)
    self._trained = max(self._trained, last)
    self._record["reached"] = last
    self._record["steps"] += steps - recomputed
    self._record["recomputed_steps"] += recomputed
    self._seconds["input_wait"] += input_wait * seconds
    busy = (1 - input_wait) * seconds
    self._all.add(busy, steps, recomputed)
    if self._first is None:
      self._first = _Loops()
      self._first.add(busy, steps, recomputed)
    elif steps == self._first.steps:
      self._like.add(busy, steps, recomputed)

  def add(self, name: str, seconds: float) -> None:
    """Time an action took; counted if `name` is a category (eval,
    checkpoint), else it stays in 'other'."""
    if name in self._seconds and name not in ("productive", "other"):
      self._seconds[name] += seconds

  def write(self, force: bool = False) -> Totals | None:
    """Writes the record if WRITE_SECS passed since the last (or `force`);
    returns the run's totals then, else None."""
    now = self._clock()
    if not force and self._written and now - self._written < WRITE_SECS:
      return None
    self._written = now
    self.wall = now - self._started
    record = dict(self._record, wall=self.wall, seconds=self._split(self.wall))
    files.JsonFile(self._wd.goodput_attempt(record["attempt"]),
                   self._wd.checkpoints).write(record, indent=1)
    return Totals.of([*self._earlier, record])

  def close(self, ended: str) -> Totals:
    """The last record: `ended` says how (finished, stopped by SIGTERM,
    failed: ...)."""
    self._record["ended"] = ended
    return self.write(force=True)

  def close_failed(self, error: Exception) -> None:
    """The failed attempt's last record, if the storage takes it: the error
    that ended the run is the one shown."""
    try:
      self.close(f"failed: {type(error).__name__}")
    except (tf.errors.OpError, OSError, errors.WorkdirError) as e:
      logging.warning("Could not write the goodput record: %s",
                      errors.first_line(e))

  def _split(self, wall: float) -> dict[str, float]:
    """The categories of the wall time so far (module doc)."""
    seconds = dict(self._seconds)
    first = self._first or _Loops()
    later = self._like
    if not later.steps:  # no later loop of the first's length: all others
      later = _Loops(self._all.busy - first.busy,
                     self._all.steps - first.steps)
    compile_ = 0.0
    if later.steps:  # else no steady rate to tell compiling from steps
      compile_ = max(0.0, first.busy - first.steps * later.busy / later.steps)
    # The compile time came out of the first loop's steps, new or not.
    recomputed = self._all.recomputed - (
        compile_ * first.recomputed / first.busy if first.busy else 0.0)
    seconds.update(compile=compile_, recomputed=recomputed,
                   productive=self._all.busy - compile_ - recomputed)
    seconds["other"] = max(0.0, wall - sum(
        v for k, v in seconds.items() if k != "other"))
    return seconds
