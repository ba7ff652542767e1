"""TensorBoard event files, metrics.jsonl and progress lines; only the chief writes.

Synopsis::

    wd = workdir.Workdir("/tmp/mnist")
    out = summaries.Summaries(wd, chief=True, total_steps=1000, trains=True,
                              eval_dir=wd.eval_events,
                              table=hparams.Table.of(...))
    out.start_run(config_json, summaries.model_summary(model))  # once
    out.purge_after(step)          # on resume: drop what a killed run wrote
    out.train(first_step=1, losses=per_step_losses, logs={...})  # one loop
    out.progress(step=100, logs={...})                           # a log line
    out.eval(step=100, logs={"loss": ..., "accuracy": ..., "examples": ...})
    out.close()

Layout: `workdir/train/` holds the loss of every step and, per loop, each
train metric, `learning_rate`, `steps_per_sec`, `examples_per_sec`,
`tokens_per_sec` (sequences), `flops_per_sec` and `mfu` (the share of the
peak, at most 1: a loop above it raises it; looper.train.flops,
looper.train.peak_flops), `input_wait_fraction`;
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
a line of `workdir/metrics.jsonl` (see `looper.workdir.jsonl`). A write
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

import datetime
import functools
import os

from absl import logging
import numpy as np
import tensorflow as tf

from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import hparams
from looper.workdir import jsonl
from looper.workdir import formats


# Above this share of a loop spent waiting for batches, the progress line
# says the run is input-bound...
INPUT_BOUND = 0.1
# ...if the wait per step is also above this: a resident batch's get_next
# alone costs ~0.1 ms per step on this project's CPUs (measured:
# tests/fixtures/tiny.py in array mode, ~4000 steps/s, 35-48% "waiting"), which
# no faster dataset_fn removes; for tiny models that is a large share of
# nothing.
INPUT_BOUND_SECS_PER_STEP = 0.0005


# Logs the progress line shows as its speed part (or its input-bound
# hint), not among the metrics.
SPEEDS = ("steps_per_sec", "examples_per_sec", "tokens_per_sec",
          "flops_per_sec", "mfu", "input_wait_fraction")


def model_summary(model) -> str:
  """Keras' summary of `model`: layers, output shapes, parameter counts."""
  parts = []
  model.summary(print_fn=parts.append)
  return "\n".join(parts).rstrip()


def _scalars(writer, values, step):
  with writer.as_default():
    for name, value in values.items():
      tf.summary.scalar(name, value, step=step)


class _GraphWriter:
  """Writes scalars with graph calls: one per loop, not one per value.

  Eager `tf.summary.scalar` costs ~0.8 ms a call, more than the step of a
  small model; the graph loop below writes 100 per-step losses in ~3 ms
  (measured). Built per writer: a traced function keeps the writer it saw.
  A write the storage refuses ends in one line (files.on_full_disk).
  """

  def __init__(self, writer, directory: str | None, checkpoints: str):
    self._writer = writer
    self._full_disk = functools.partial(files.on_full_disk, directory,
                                        "events", checkpoints)
    # Traced once per set of names (the loop's logs, the goodput, ...): a
    # few a run, by design. One function per writer: TensorFlow counts the
    # traces of one Python function across its instances and warns of
    # "retracing" at 5 within 10 calls, which a method reached with the
    # train, eval and HParams writers' sets (a partial is its own key).
    self._scalars = tf.function(functools.partial(_scalars, writer),
                                autograph=False)

  # Any loop length, one trace: clamped loops vary in length. No AutoGraph
  # (an explicit loop): its rewrite would be most of the first write's time.
  @tf.function(input_signature=[tf.TensorSpec([None], tf.float32),
                                tf.TensorSpec([], tf.int64)],
               autograph=False)
  def series(self, values, first_step):
    """values[i] as 'loss' at step first_step + i."""
    def write(i):
      # Inside a while loop TF prefixes tags with 'while/'; "" resets that.
      with tf.name_scope(""):
        tf.summary.scalar("loss", values[i],
                          step=first_step + tf.cast(i, tf.int64))
      return i + 1
    with self._writer.as_default():
      tf.while_loop(lambda i: i < tf.size(values), write, (tf.constant(0),))

  # Tensors are made from NumPy values, never from Python numbers:
  # TensorFlow keeps every distinct Python int or float it makes an eager
  # tensor of, for the life of the process (its scalar cache, ~750 bytes
  # each, measured); every loop's step and metrics would stay.
  def write_losses(self, losses: np.ndarray, first_step: int) -> None:
    with self._full_disk():
      self.series(tf.constant(np.asarray(losses, np.float32)),
                  tf.constant(np.int64(first_step)))

  def write(self, logs: dict[str, float], step: int) -> None:
    with self._full_disk():
      self._scalars({k: tf.constant(np.float32(v)) for k, v in logs.items()},
                    tf.constant(np.int64(step)))
      self._writer.flush()

  def flush(self) -> None:
    with self._full_disk():
      self._writer.flush()


class Summaries:
  """Writes train/ and eval/ event files; a no-op writer on non-chiefs.

  Args:
    workdir: the run's `looper.workdir.Workdir`.
    chief: whether this process writes (else every writer is a no-op).
    total_steps: `train.steps`, for the progress line's ETA.
    trains: write train events (`workdir.train_events`) and, as a training
      run, metrics.jsonl and the HParams row (with `table`).
    eval_dir: where eval events go (one of the workdir's: an evaluator
      beside training has its own); None: none are written.
    table: the run's HParams row (looper.workdir.hparams).
    input_hint: what to try when the progress line says the run is
      input-bound (`looper.data.input.Input.faster`: by input mode).
  """

  def __init__(self, workdir: workdir_lib.Workdir, *, chief: bool,
               total_steps: int, trains: bool = False,
               eval_dir: str | None = None,
               table: hparams.Table | None = None, input_hint: str = ""):
    self._chief = chief
    self._total_steps = total_steps
    self._input_hint = input_hint
    self._workdir = workdir
    training = chief and trains
    self._table = table if training else None
    self._dirs = [
        workdir.train_events if training else None,
        eval_dir if chief else None,
        workdir.hparams_events if self._table else None]
    self._log = jsonl.MetricsLog(workdir.metrics) if training else None
    self._best = None  # the best value of table.best so far
    self._fresh = False  # start_run ran and no loop was written since
    self._open()

  def _open(self) -> None:
    with self._full_disk(self._workdir.root, "event files"):
      self._writers = [tf.summary.create_file_writer(d) if d else
                       tf.summary.create_noop_writer() for d in self._dirs]
    self._train, self._eval, self._hparams = self._writers
    self._train_scalars, self._eval_scalars, self._hparams_scalars = [
        _GraphWriter(w, d, self._workdir.checkpoints)
        for w, d in zip(self._writers, self._dirs)]

  def _full_disk(self, directory: str, writing: str):
    """A write the storage refuses ends in one line naming `directory`."""
    return files.on_full_disk(directory, writing, self._workdir.checkpoints)

  def text(self, tag: str, text: str, step: int = 0) -> None:
    """`text` in a markdown code block, which TensorBoard shows verbatim."""
    with self._train.as_default():
      tf.summary.text(tag, f"```\n{text}\n```", step=step)

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
    for directory in filter(None, self._dirs):
      for path in tf.io.gfile.glob(os.path.join(directory, "*tfevents*")):
        tf.io.gfile.remove(path)
    self._open()
    self.text("config", config_json)
    self.text("model_summary", model_text)
    self._train_scalars.flush()
    if self._table is not None:
      with self._hparams.as_default():
        self._table.write_start(trial_id=self._workdir.root)
      self._hparams_scalars.flush()
    if self._log is not None:
      with self._full_disk(self._workdir.root, "metrics.jsonl"):
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
      with self._full_disk(self._workdir.root, "metrics.jsonl"):
        self._log.truncate_after(step)
      if self._table is not None:
        self._best = self._best_in(jsonl.read(self._workdir.metrics))
    for writer in (self._train_scalars, self._eval_scalars,
                   self._hparams_scalars):
      writer.flush()
    stale = {}
    for directory in filter(None, self._dirs):
      for path in tf.io.gfile.glob(os.path.join(directory, "*tfevents*")):
        kept = _events_up_to(path, step)
        if kept is not None:
          stale[path] = kept
    if stale:
      self.close()
      for path, kept in stale.items():
        with self._full_disk(os.path.dirname(path), "events"):
          _rewrite(path, kept)
      self._open()

  def train(self, first_step: int, losses: np.ndarray,
            logs: dict[str, float]) -> None:
    """One loop: the loss of each step from `first_step`, then loop scalars."""
    self._fresh = False
    last = first_step + len(losses) - 1
    if len(losses) == 1:
      # No while loop in a one-step loop's writes: the profiler would take
      # its iterations for the train steps (measured: the Profile tab then
      # finds no step; see Trainer._train_loop).
      self._train_scalars.write({"loss": losses[0]}, step=last)
    else:
      self._train_scalars.write_losses(losses, first_step)
    # The per-step series above is the loss curve; the loop mean is logged.
    self._train_scalars.write(
        {k: v for k, v in logs.items() if k != "loss"}, step=last)
    if self._table is not None:
      self._hparams_scalars.write({self._table.train_loss_tag: logs["loss"]},
                                  step=last)
    self._metrics_line("train", last, logs)

  def _metrics_line(self, kind: str, step: int, logs: dict[str, float]
                    ) -> None:
    if self._log is not None:
      with self._full_disk(self._workdir.root, "metrics.jsonl"):
        self._log.write(kind, step, logs)

  def progress(self, step: int, logs: dict[str, float]) -> None:
    """The progress line: the metrics, the speed (`speed`), the ETA;
    `logs` must hold 'steps_per_sec'.

    The input wait shows only when it matters (above INPUT_BOUND of the
    time and INPUT_BOUND_SECS_PER_STEP per step), with what to try in the
    run's input mode (`input_hint`).
    """
    if self._chief:
      eta = (self._total_steps - step) / max(logs["steps_per_sec"], 1e-9)
      shown = {k: v for k, v in logs.items() if k not in SPEEDS}
      wait = logs.get("input_wait_fraction", 0.0)
      per_step = wait / max(logs["steps_per_sec"], 1e-9)
      hint = ("" if wait <= INPUT_BOUND or
              per_step <= INPUT_BOUND_SECS_PER_STEP else
              f" | input-bound: {wait:.0%} of the time waiting for data"
              f" ({self._input_hint})")
      logging.info("train step %d/%d: %s | %s | ETA %s%s", step,
                   self._total_steps, formats.format_logs(shown),
                   formats.speed(logs),
                   datetime.timedelta(seconds=round(eta)), hint)

  def eval(self, step: int, logs: dict[str, float]) -> None:
    self._eval_scalars.write(logs, step)
    if self._table is not None:
      results = self._table.eval_results(logs, self._best)
      self._best = results.get(self._table.best_tag, self._best)
      self._hparams_scalars.write(results, step)
    self._metrics_line("eval", step, logs)
    if self._chief:
      logging.info("eval at step %d: %s", step, formats.format_logs(logs))

  def goodput(self, step: int, fractions: dict[str, float]) -> None:
    """The run's goodput so far and each loss' share, as `goodput/<name>`
    train scalars (looper.train.goodput)."""
    self._train_scalars.write(
        {f"goodput/{k}": v for k, v in fractions.items()}, step)

  def _best_in(self, kept: list[dict]) -> float | None:
    """The best value of table.best in the eval lines kept (a resume)."""
    best = None
    for line in kept:
      if line["kind"] == "eval":
        best = self._table.eval_results(line, best).get(
            self._table.best_tag, best)
    return best

  def close(self) -> None:
    """Closes the writers. Each write was flushed as it was made, so only
    a write that already failed (and ended the run in its one line) can
    fail here again: that is not raised a second time."""
    for writer in self._writers:
      try:
        writer.close()
      except tf.errors.OpError as e:
        if files.storage_refused(e) is None:
          raise


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
