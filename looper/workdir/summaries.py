"""The run's writers composed: TensorBoard events, metrics.jsonl, the lines, the trackers; only the chief writes.

Synopsis::

    wd = workdir.Workdir("/tmp/mnist")
    out = summaries.Summaries(wd, chief=True, total_steps=1000, trains=True,
                              eval_dir=wd.eval_events,
                              table=hparams.Table.of(...))
    out.start_run(config_json, summaries.model_summary(model))  # once
    out.purge_after(step)          # on resume: drop what a killed run wrote
    out.train(first_step=1, values={"loss": losses, ...}, logs={...})
                                   # one loop's per-step values, then its
                                   # logs and train line
    out.eval(step=100, logs={"loss": ..., "accuracy": ..., "examples": ...})
    out.writer.write_images(100, {"samples": images})  # an action's writes
    out.close()

Each write goes through the writers of looper.workdir.writers, composed
here as three `MultiWriter`s (see `Summaries`); the run-level duties stay
here: the HParams row, start_run, the purge on resume.

Layout: `workdir/train/` holds the loss of every step (and each per-step
value a Trainer's `train_step` returns beside it) and, per loop, each
train metric, `learning_rate`, `steps_per_sec`, `examples_per_sec`,
`tokens_per_sec` (sequences), `flops_per_sec` and `mfu` (the share of the
peak, at most 1: a loop above it raises it; looper.measure.flops,
looper.measure.peak_flops), `input_wait_fraction`;
`workdir/eval/` holds every eval metric and `examples` (how many real
examples were counted). Same tag names in both runs, so TensorBoard draws
train and eval on one chart. A continuous evaluator writes to its own
directory (`eval_dir`: `workdir/eval_continuous/`). The paths are the
Workdir's (looper.workdir).

What a run is, written once as it starts from step 0 (`start_run`): the
resolved config and the model summary as text in `train/`, and the run's
row of the HParams table in `workdir/hparams/` (see `looper.workdir.hparams`),
whose metric columns (`hparams/eval_accuracy`, ..., `hparams/train_loss`)
are written there as the run goes. Every train loop and evaluation is also
a line of `workdir/metrics.jsonl` (see `looper.workdir.jsonl`), and so is
every write of scalars by an action (an `action` line). A write
the storage refuses (a full disk) ends the run in one line naming the
directory and the checkpoint kept (`files.on_full_disk`).

Replays: a run killed after its last checkpoint wrote events for steps it
will redo when resumed. `purge_after(step)` rewrites the event files without
them before training goes on, so TensorBoard never shows two values for one
step. (TensorBoard's own restart marker, a SessionLog START event, is not
enough: the EventAccumulator never purges TF2 summaries with it, and
TensorBoard's Python loader only in some configurations; removing the
events works with every reader.)
"""

import os

import numpy as np
import tensorflow as tf

from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import hparams
from looper.workdir import jsonl
from looper.workdir import lines
from looper.workdir import writers


def model_summary(model) -> str:
  """Keras' summary of `model`: layers, output shapes, parameter counts."""
  parts = []
  model.summary(print_fn=parts.append)
  return "\n".join(parts).rstrip()


class _LoopScalars(writers.Writer):
  """A loop's logs as train/ events, but the means of its per-step values
  (`per_step`: their names): the steps' own are those curves
  (`Summaries.train`)."""

  def __init__(self, events: writers.TensorBoard):
    self._events = events
    self.per_step = {"loss"}

  def write_scalars(self, step, scalars):
    self._events.write_scalars(
        step, {k: v for k, v in scalars.items() if k not in self.per_step})


class Summaries:
  """The run's writers, composed (looper.workdir.writers); no-ops on
  non-chiefs.

  Args:
    workdir: the run's `looper.workdir.Workdir`.
    chief: whether this process writes (else every writer is a no-op).
    total_steps: `train.steps`, for the train line's ETA.
    trains: write train events (`workdir.train_events`) and, as a training
      run, metrics.jsonl and the HParams row (with `table`).
    eval_dir: where eval events go (one of the workdir's: an evaluator
      beside training has its own); None: none are written.
    table: the run's HParams row (looper.workdir.hparams).
    input_hint: what to try when the train line's advice says the run is
      input-bound (`looper.data.input.Input.faster`: by input mode).
    trackers: writers that also get every line of metrics.jsonl (its
      names prefixed by kind: `jsonl.PREFIXES`) and what actions write
      (looper.trackers); a training run's chief only.

  The composed writers: `train_writer` (each loop's logs: train/ events,
  metrics.jsonl, the train line (looper.workdir.lines), the trackers),
  `eval_writer` (each evaluation's: eval events, metrics.jsonl, its lines,
  the trackers) and
  `writer`, what actions write through (`Moment.writer`): train/
  events, metrics.jsonl's `action` lines, a line, the trackers.
  """

  def __init__(self, workdir: workdir_lib.Workdir, *, chief: bool,
               total_steps: int, trains: bool = False,
               eval_dir: str | None = None,
               table: hparams.Table | None = None, input_hint: str = "",
               trackers: tuple[writers.Writer, ...] = ()):
    self._chief = chief
    self._workdir = workdir
    training = chief and trains
    self._table = table if training else None
    self._events = [writers.TensorBoard(d, workdir.checkpoints) for d in (
        workdir.train_events if training else None,
        eval_dir if chief else None,
        workdir.hparams_events if self._table else None)]
    self._train_events, self._eval_events, self._hparams_events = (
        self._events)
    self._log = jsonl.MetricsLog(workdir.metrics) if training else None
    self._best = None  # the best value of table.best so far
    self._fresh = False  # start_run ran and no loop was written since
    # The run's final figures, as last written: the HParams' metric
    # columns and the goodput (what trackers get as the run ends).
    self.figures: dict[str, float] = {}
    if self._table is not None:  # a resume's so far (start_run: none)
      self._replay(jsonl.read(workdir.metrics))
    trackers = trackers if training else ()

    def composed(kind, events, shown):
      lines = [writers.MetricsLine(self._log, kind, workdir)
               ] if self._log else []
      return writers.MultiWriter(
          [events, *lines, *([shown] if chief else []),
           *(writers.Prefixed(t, jsonl.PREFIXES[kind]) for t in trackers)])

    self._loop_events = _LoopScalars(self._train_events)
    self._progress = lines.Progress(total_steps, input_hint)
    self.train_writer = composed("train", self._loop_events, self._progress)
    self.eval_writer = composed("eval", self._eval_events, lines.Logged("eval"))
    self.writer = composed("action", self._train_events,
                           lines.Logged("logged"))

  def text(self, tag: str, text: str, step: int = 0) -> None:
    """`text` in a markdown code block, which TensorBoard shows verbatim."""
    self._train_events.write_texts(step, {tag: f"```\n{text}\n```"})

  def start_run(self, config_json: str, model_text: str) -> None:
    """Writes what the run is (see module doc); once, at step 0.

    A run starts from step 0 only in a workdir without a checkpoint: events
    already there are from an attempt killed before its first save, and are
    deleted, so TensorBoard shows one config, one model and one HParams
    session (the plugin would keep the first).
    """
    if not self._chief:
      return
    self.close()
    for events in self._events:
      if events.directory:
        for path in tf.io.gfile.glob(os.path.join(events.directory,
                                                  "*tfevents*")):
          tf.io.gfile.remove(path)
      events.open()
    self.text("config", config_json)
    self.text("model_summary", model_text)
    if self._table is not None:
      self._replay([])
      with self._hparams_events.as_default():
        self._table.write_start(trial_id=self._workdir.root)
      self._hparams_events.flush()
    if self._log is not None:
      with self._full_disk("metrics.jsonl"):
        self._log.start()
    self._fresh = True

  def purge_after(self, step: int) -> None:
    """Removes events of steps after `step` (a resume or a roll-back).

    The files holding any are rewritten without them (atomically, file by
    file), so no reader can show a replayed step twice; new events then go
    to new files.
    """
    if not self._chief or self._fresh:
      return  # a run start_run began has nothing past its first step yet
    if self._log is not None:
      with self._full_disk("metrics.jsonl"):
        self._log.truncate_after(step)
      if self._table is not None:
        self._replay(jsonl.read(self._workdir.metrics))
    stale = {}
    for events in self._events:
      events.flush()
      for path in tf.io.gfile.glob(os.path.join(events.directory or "",
                                                "*tfevents*")):
        kept = _events_up_to(path, step)
        if kept is not None:
          stale[path] = kept
    if stale:
      self.close()
      for path, kept in stale.items():
        with files.on_full_disk(os.path.dirname(path), "events",
                                self._workdir.checkpoints):
          _rewrite(path, kept)
      for events in self._events:
        events.open()

  def _full_disk(self, writing: str):
    """A write the storage refuses ends in one line naming the workdir."""
    return files.on_full_disk(self._workdir.root, writing,
                              self._workdir.checkpoints)

  def train(self, first_step: int, values: dict[str, np.ndarray],
            logs: dict[str, float]) -> None:
    """One loop: each step's values from `first_step` ('loss' and what
    train_step adds), then the loop's logs at its last step
    (`train_writer`)."""
    self._fresh = False
    steps = len(values["loss"])
    last = first_step + steps - 1
    if steps == 1:
      # No while loop in a one-step loop's writes: the profiler would take
      # its iterations for the train steps (measured: the Profile tab then
      # finds no step; see Trainer._train_loop).
      self._train_events.write_scalars(
          last, {k: v[0] for k, v in values.items()})
    else:
      self._train_events.write_series(first_step, values)
    self._loop_events.per_step = set(values)
    self._progress.per_step = list(values)
    if self._table is not None:
      self._column(last, {self._table.train_loss_tag: logs["loss"]})
    self.train_writer.write_scalars(last, logs)

  def eval(self, step: int, logs: dict[str, float]) -> None:
    """One evaluation's logs (`eval_writer`) and the HParams' columns."""
    if self._table is not None:
      results = self._table.eval_results(logs, self._best)
      self._best = results.get(self._table.best_tag, self._best)
      self._column(step, results)
    self.eval_writer.write_scalars(step, logs)
    self._progress.interrupted()  # the next train row: under its header

  def _column(self, step: int, values: dict[str, float]) -> None:
    self._hparams_events.write_scalars(step, values)
    self.figures.update(values)

  def goodput(self, step: int, fractions: dict[str, float]) -> None:
    """The run's goodput so far and each loss' share, as `goodput/<name>`
    train scalars (looper.measure.goodput)."""
    named = {f"goodput/{k}": v for k, v in fractions.items()}
    self._train_events.write_scalars(step, named)
    self.figures.update(named)

  def _replay(self, kept: list[dict]) -> None:
    """The HParams' columns as the lines kept (a resume) left them: the
    best of table.best so far, and the final figures (a rerun with nothing
    left to train sends them again: its trackers' last run may have lost
    them to a kill)."""
    self._best, self.figures = None, {}
    for line in kept:
      if line["kind"] == "eval":
        results = self._table.eval_results(line, self._best)
        self._best = results.get(self._table.best_tag, self._best)
        self.figures.update(results)
      elif line["kind"] == "train":
        self.figures[self._table.train_loss_tag] = line["loss"]

  def close(self) -> None:
    """Closes the event files (the trackers are the run's to close)."""
    for events in self._events:
      events.close()


def _events_up_to(path: str, step: int) -> list[bytes] | None:
  """The records of an event file up to `step`; None if that is all of them.

  A file cut short by a crash ends in a partial record: it is dropped too.
  """
  kept, dropped = [], False
  try:
    for record in tf.data.TFRecordDataset(path):
      record = record.numpy()
      if tf.compat.v1.Event.FromString(record).step > step:
        dropped = True
      else:
        kept.append(record)
  except tf.errors.DataLossError:  # the partial last record of a crash
    dropped = True
  return kept if dropped else None


def _rewrite(path: str, records: list[bytes]) -> None:
  """Replaces an event file atomically by one holding `records`."""
  with files.replacing(path) as tmp:  # no 'tfevents' in its name
    with tf.io.TFRecordWriter(tmp) as writer:
      for record in records:
        writer.write(record)
