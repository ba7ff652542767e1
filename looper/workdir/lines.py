"""The lines a run prints of its logs: the train rows, their detail, the eval lines, advice once.

Synopsis::

    from looper.workdir import lines
    progress = lines.Progress(total_steps=1000, input_hint="array mode: ...")
    progress.per_step = ["loss", "d_loss"]   # the step's own values
    progress.write_scalars(100, logs)        # a loop's logs (Summaries.train)
    # train rows: means over each loop's steps (not running means); lr ...
    #                       loss  accuracy        lr   steps/s       ETA
    # train step  100/1000    0.8173    0.7492  9.755e-4      46.6   0:00:19
    #               detail  2.91k examples/s, 105 GFLOP/s = 56.6% MFU, ...
    progress.interrupted()   # an evaluation printed: the header row again
    lines.Logged("eval").write_scalars(500, eval_logs)
    # eval at step 500: loss  0.09066  accuracy   0.9715  examples     2000
    lines.evaluation(eval_logs, "  last eval   ", timed=False)  # a line
                                    # per eval set (the closing summary's)

A line fits LINE columns with the time absl's short format puts before it
(Keras' epoch line is about as wide). A train row holds the step, the
loss, the first metric, up to two of the step's own per-step values, more
metrics while they fit, the learning rate, the speed and the ETA, each
right-aligned under its name in a header row (WIDTH columns at least:
looper.workdir.formats), so a figure keeps its columns from row to row;
the columns are chosen on a loop's first row and kept. The rest of a
loop's logs (the health figures, examples/s or tokens/s, FLOP/s and MFU,
the input wait, what did not fit) go to TensorBoard, metrics.jsonl and the
trackers, and at `--verbosity=1` to a detail line under the row. Each
figure is the loop's: the mean over its steps (the loss, the per-step
values, the metrics, reset each loop), the learning rate at its last step,
its speed; Keras' progress bar shows the running mean since the epoch
began instead. A legend line says so once, above the first header row;
advice (the input-bound hint) prints once, again only if it changes.
"""

import textwrap

from absl import logging

from looper.options import metrics as metrics_lib
from looper.workdir import formats
from looper.workdir import writers

LINE = 120  # the columns of a line, its time included
TIME = len("12:03:04 ")  # what absl's short format puts before a line
# Above this share of a loop spent waiting for batches, the train rows'
# advice says the run is input-bound...
INPUT_BOUND = 0.1
# ...if the wait per step is also above this: a resident batch's get_next
# alone costs ~0.1 ms per step on this project's CPUs (measured:
# tests/fixtures/tiny.py in array mode, ~4000 steps/s, 35-48% "waiting"), which
# no faster dataset_fn removes; for tiny models that is a large share of
# nothing.
INPUT_BOUND_SECS_PER_STEP = 0.0005

# Logs the detail line shows as the loop's speed, not among its figures.
SPEEDS = ("steps_per_sec", "examples_per_sec", "tokens_per_sec",
          "flops_per_sec", "mfu", "input_wait_fraction")

# Printed once, above the first header row.
LEGEND = ("train rows: means over each loop's steps (not running means); lr"
          " at the loop's end; more with --verbosity=1")


def _width(name: str) -> int:
  """The columns of a figure's column: its name's, at least WIDTH."""
  return max(formats.WIDTH, len(name))


def _item(name: str, value: float) -> str:
  """'loss   0.8173': a name and its figure in WIDTH columns."""
  return f"{name} {formats.figure(value):>{formats.WIDTH}}"


def _wrapped(head: str, items: list[str], *, timed: bool = True) -> str:
  """`head`, then `items` two spaces apart, in lines of LINE columns (the
  time before the first if `timed`): the next lines start under the first
  item."""
  room = LINE - TIME * timed - len(head)
  rows, row = [], ""
  for item in items:
    if row and len(row) + 2 + len(item) > room:
      rows.append(row)
      row = ""
    row += ("  " if row else "") + item
  rows.append(row)
  return head + f"\n{' ' * (TIME * timed + len(head))}".join(rows)


def _sets(logs: dict[str, float]) -> dict[str, dict[str, float]]:
  """`logs` by eval set: a set's names start '<set>/' and it counts its
  'examples' (looper.data.splits); one set of all of them if none. An
  output's metrics ('digit/accuracy') count no examples of their own."""
  sets: dict[str, dict[str, float]] = {}
  for name, value in logs.items():
    first = name.split("/", 1)[0]
    if "/" in name and f"{first}/examples" in logs:
      sets.setdefault(first, {})[name.split("/", 1)[1]] = value
    else:
      sets.setdefault("", {})[name] = value
  return sets


def evaluation(logs: dict[str, float], head: str, *,
               timed: bool = True) -> list[str]:
  """An evaluation's line per eval set: `head`, the set's name, its
  figures (the loss first, the count of examples last), in lines of LINE
  columns (`timed`: a log line's time before them)."""
  sets = _sets(logs)
  width = max(len(name) for name in sets)
  shown = []
  for name, figures in sets.items():
    order = sorted(figures, key=lambda k: (k != "loss", k == "examples"))
    shown.append(_wrapped(head + (f"{name:<{width}}  " if width else ""),
                          [_item(k, figures[k]) for k in order], timed=timed))
  return shown


class Logged(writers.Writer):
  """Scalars as INFO lines, one per eval set: '`what` at step 100: loss
  0.3126  accuracy   0.9051  examples    10000'."""

  def __init__(self, what: str):
    self._what = what

  def write_scalars(self, step, scalars):
    for line in evaluation(scalars, f"{self._what} at step {step}: "):
      logging.info("%s", line)


def _clock(seconds: float) -> str:
  """'0:00:18', '27:46:40': hours, minutes, seconds (no days)."""
  seconds = round(seconds)
  return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress(writers.Writer):
  """The train row of a loop's logs under its header row (module doc),
  and at --verbosity=1 its detail line; the logs must hold
  'steps_per_sec'. `per_step`: the names of the step's own per-step
  values ('loss' and what a train_step adds beside it), in its order
  (looper.workdir.summaries sets them).

  The input wait is advice once it matters (above INPUT_BOUND of the time
  and INPUT_BOUND_SECS_PER_STEP per step), with what to try in the run's
  input mode (`input_hint`: looper.data.input.Input.faster).
  """

  def __init__(self, total_steps: int, input_hint: str = ""):
    self._total_steps, self._input_hint = total_steps, input_hint
    self.per_step = ["loss"]
    self._chosen: dict[tuple, list[str]] = {}  # logs' names -> columns
    self._heading = None  # the header row last printed
    self._advised = None  # the input hint last printed
    self._told = False  # the legend

  def interrupted(self) -> None:
    """Other lines came between the rows (an evaluation's): the next row
    has its header row above it again."""
    self._heading = None

  def write_scalars(self, step, scalars):
    rate = max(scalars["steps_per_sec"], 1e-9)
    eta = (self._total_steps - step) / rate
    total = self._total_steps
    first = f"train step {step:>{len(str(total))}}/{total}"
    fixed = [("lr", formats.exponent(scalars["learning_rate"]))
             ] if "learning_rate" in scalars else []
    fixed += [("steps/s", formats.rate(rate)), ("ETA", _clock(eta))]
    shown = self._choose(scalars, LINE - TIME - len(first) - sum(
        2 + _width(name) for name, _ in fixed))
    columns = [(k, formats.figure(scalars[k])) for k in shown] + fixed
    heading = " " * len(first) + "".join(
        f"  {name:>{_width(name)}}" for name, _ in columns)
    if heading != self._heading:
      if not self._told:
        self._told = True
        logging.info("%s", LEGEND)
      self._heading = heading
      logging.info("%s", heading)
    logging.info("%s", first + "".join(
        f"  {text:>{_width(name)}}" for name, text in columns))
    if logging.vlog_is_on(1):
      self._detail(first, scalars, shown)
    self._advise(step, scalars.get("input_wait_fraction", 0.0), rate)

  def _choose(self, scalars, room: int) -> list[str]:
    """The columns of logs with `scalars`' names (module doc), chosen once
    for those names: what fits `room` columns."""
    key = tuple(scalars)
    if key not in self._chosen:
      steps = [k for k in self.per_step if k != "loss" and k in scalars]
      metrics = [k for k in scalars if k not in self.per_step and
                 k not in metrics_lib.RESERVED_METRIC_NAMES]
      chosen, used = set(), 0
      for name in ["loss", *metrics[:1], *steps[:2], *metrics[1:]]:
        if name in scalars and used + 2 + _width(name) <= room:
          chosen.add(name)
          used += 2 + _width(name)
      self._chosen[key] = [k for k in scalars if k in chosen]
    return self._chosen[key]

  def _detail(self, first: str, scalars, shown: list[str]) -> None:
    """The rest of the loop's logs, as a DEBUG line (absl's --verbosity=1):
    its speed beside steps/s, its input wait, the figures not shown."""
    speed = [f"{formats.rate(scalars[f'{count}_per_sec'])} {count}/s"
             for count in ("tokens", "examples")
             if f"{count}_per_sec" in scalars][:1]
    if "flops_per_sec" in scalars:
      speed.append(formats.flops(scalars["flops_per_sec"]) + (
          f" = {100 * scalars['mfu']:.3g}% MFU" if "mfu" in scalars else ""))
    if "input_wait_fraction" in scalars:
      speed.append(f"input wait {scalars['input_wait_fraction']:.0%}")
    rest = [_item(k, v) for k, v in scalars.items() if k not in shown and
            k not in SPEEDS and k != "learning_rate"]
    head = f"{'detail':>{len(first)}}  "
    logging.vlog(1, "%s", _wrapped(head, [", ".join(speed)] * bool(speed)
                                   + rest))

  def _advise(self, step: int, wait: float, rate: float) -> None:
    """The input-bound advice, if the loop waited for data (class doc) and
    the advice differs from the one printed last."""
    if wait <= INPUT_BOUND or wait / rate <= INPUT_BOUND_SECS_PER_STEP:
      return
    if self._input_hint != self._advised:
      self._advised = self._input_hint
      advice = textwrap.wrap(
          f"input-bound: the loop to step {step} waited for data {wait:.0%}"
          f" of its time (each loop's: metrics.jsonl's input_wait_fraction);"
          f" {self._input_hint}", LINE - TIME, subsequent_indent="  ")
      logging.info("%s", f"\n{' ' * TIME}".join(advice))
