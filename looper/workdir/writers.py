"""One writer interface for every write a run makes (CLU's MetricWriter shape), and its writers.

Synopsis::

    from looper.workdir import writers
    out = writers.MultiWriter([
        writers.TensorBoard(wd.train_events, wd.checkpoints),
        writers.MetricsLine(jsonl.MetricsLog(wd.metrics), "action", wd),
        lines.Logged("logged")])
    out.write_scalars(500, {"retrieval@10": 0.81})
    out.write_images(500, {"samples": images})     # [N, H, W, C]: uint8,
                                                   # or floats in [0, 1]
    out.write_histograms(500, {"logits": array})
    out.write_texts(500, {"sample": "the cat sat"})
    out.write_hparams({"optimizer.name": "adam"})
    out.flush()
    out.close()

    def log_samples(now):             # an action (looper.Action): its
      now.writer.write_images(now.step, {"samples": make_images()})

`Writer` is the interface; a writer holds what it can and ignores the rest
(`Writer`'s methods do nothing):
  TensorBoard   event files in one folder: every kind
  MetricsLine   scalars as lines of one kind of metrics.jsonl
                (looper.workdir.jsonl)
  Prefixed      another writer, its names prefixed ("train/loss")
  MultiWriter   several as one, in order
The lines a run prints are writers too (looper.workdir.lines: `Progress`,
the train line; `Logged`, the eval and action lines), and so are the
experiment trackers (looper.trackers). The run's
`looper.workdir.summaries.Summaries` composes them: one writer for train
loops, one for evaluations, and one for actions (`Moment.writer`).
"""

import functools
from typing import Any, Mapping, Sequence

import numpy as np
from tensorboard.plugins.hparams import api as hp
import tensorflow as tf

from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import jsonl

class Writer:
  """What every writer takes (CLU's `MetricWriter`); each method here
  does nothing: a writer overrides what it holds."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """{name: number} at `step`."""

  def write_images(self, step: int, images: Mapping[str, Any]) -> None:
    """{name: array [N, H, W, C]} at `step` (uint8, or floats in [0, 1];
    C of 1, 3 or 4)."""

  def write_histograms(self, step: int, arrays: Mapping[str, Any],
                       num_buckets: Mapping[str, int] | None = None) -> None:
    """{name: array of values} at `step`, in `num_buckets[name]` buckets
    (default: the writer's)."""

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    """{name: text} at `step` (TensorBoard renders markdown)."""

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """{name: bool, number or string}: what the run is."""

  def flush(self) -> None:
    """What was written is kept (on disk, or sent)."""

  def close(self) -> None:
    """Flushes and frees the writer."""


class MultiWriter(Writer):
  """Every call, to each of `writers` in order."""

  def __init__(self, writers: Sequence[Writer]):
    self.writers = list(writers)

  def write_scalars(self, step, scalars):
    for w in self.writers:
      w.write_scalars(step, scalars)

  def write_images(self, step, images):
    for w in self.writers:
      w.write_images(step, images)

  def write_histograms(self, step, arrays, num_buckets=None):
    for w in self.writers:
      w.write_histograms(step, arrays, num_buckets)

  def write_texts(self, step, texts):
    for w in self.writers:
      w.write_texts(step, texts)

  def write_hparams(self, hparams):
    for w in self.writers:
      w.write_hparams(hparams)

  def flush(self):
    for w in self.writers:
      w.flush()

  def close(self):
    for w in self.writers:
      w.close()


class Prefixed(Writer):
  """`writer` with `prefix` before each name (not the hparams')."""

  def __init__(self, writer: Writer, prefix: str):
    self._writer, self._prefix = writer, prefix

  def _named(self, values: Mapping[str, Any] | None):
    return values and {self._prefix + k: v for k, v in values.items()}

  def write_scalars(self, step, scalars):
    self._writer.write_scalars(step, self._named(scalars))

  def write_images(self, step, images):
    self._writer.write_images(step, self._named(images))

  def write_histograms(self, step, arrays, num_buckets=None):
    self._writer.write_histograms(step, self._named(arrays),
                                  self._named(num_buckets))

  def write_texts(self, step, texts):
    self._writer.write_texts(step, self._named(texts))

  def write_hparams(self, hparams):
    self._writer.write_hparams(hparams)

  # Flushed and closed by whoever holds `writer` itself.


def _scalars(writer, values, step):
  with writer.as_default():
    for name, value in values.items():
      tf.summary.scalar(name, value, step=step)


def _series(writer, names, values, first_step):
  """values[j, i] as names[j] at step first_step + i."""
  def write(i):
    # Inside a while loop TF prefixes tags with 'while/'; "" resets that.
    with tf.name_scope(""):
      for j, name in enumerate(names):
        tf.summary.scalar(name, values[j, i],
                          step=first_step + tf.cast(i, tf.int64))
    return i + 1
  with writer.as_default():
    tf.while_loop(lambda i: i < tf.shape(values)[1], write,
                  (tf.constant(0),))


class TensorBoard(Writer):
  """Event files in `directory` (None: nothing is written), flushed at
  each write; a write the storage refuses ends in one line naming the
  folder (files.on_full_disk; `checkpoints`: the run's, named as kept).

  Scalars go through graph calls, one per write: eager
  `tf.summary.scalar` costs ~0.8 ms a call, more than the step of a small
  model; `write_series`' graph loop writes 100 per-step losses in ~3 ms
  (measured). Tensors are made from NumPy values, never from Python
  numbers: TensorFlow keeps every distinct Python int or float it makes an
  eager tensor of, for the life of the process (its scalar cache, ~750
  bytes each, measured); every loop's step and metrics would stay.
  `close()` then `open()` starts new files (a purge rewrote the old ones).
  """

  def __init__(self, directory: str | None, checkpoints: str):
    self.directory = directory
    self._checkpoints = checkpoints
    self.open()

  def open(self) -> None:
    with self._refused():
      self._writer = (tf.summary.create_file_writer(self.directory)
                      if self.directory else tf.summary.create_noop_writer())
    # Traced once per set of names (the loop's logs, the goodput, ...): a
    # few a run, by design. One function per writer: TensorFlow counts the
    # traces of one Python function across its instances and warns of
    # "retracing" at 5 within 10 calls, which a method reached with the
    # train, eval and HParams writers' sets (a partial is its own key).
    self._scalars = tf.function(functools.partial(_scalars, self._writer),
                                autograph=False)
    # Per set of names, any loop length, one trace: clamped loops vary in
    # length. No AutoGraph (an explicit loop): its rewrite would be most of
    # the first write's time. Made anew with each writer: a trace holds the
    # writer it saw (a purge's reopened files would get a closed one's
    # writes).
    self._series = {}

  def as_default(self):
    """This writer as tf.summary's default (`with events.as_default():`)."""
    return self._writer.as_default()

  def _refused(self):
    return files.on_full_disk(self.directory, "events", self._checkpoints)

  def write_series(self, first_step: int,
                   values: Mapping[str, np.ndarray]) -> None:
    """values[name][i] as `name` at step first_step + i (per-step values of
    one length: the loss, ...), one graph call."""
    names = tuple(values)
    if names not in self._series:
      self._series[names] = tf.function(
          functools.partial(_series, self._writer, names),
          input_signature=[tf.TensorSpec([len(names), None], tf.float32),
                           tf.TensorSpec([], tf.int64)], autograph=False)
    with self._refused():
      self._series[names](
          tf.constant(np.array([values[n] for n in names], np.float32)),
          tf.constant(np.int64(first_step)))

  def write_scalars(self, step, scalars):
    if scalars:
      with self._refused():
        self._scalars({k: tf.constant(np.float32(v))
                       for k, v in scalars.items()},
                      tf.constant(np.int64(step)))
        self._writer.flush()

  def _eager(self, step: int, write) -> None:
    """`write(step tensor)` with this writer as the default, flushed."""
    with self._refused(), self._writer.as_default():
      write(tf.constant(np.int64(step)))
      self._writer.flush()

  def write_images(self, step, images):
    def write(at):
      for name, value in images.items():
        value = np.asarray(value)
        tf.summary.image(name, value, step=at, max_outputs=len(value))
    self._eager(step, write)

  def write_histograms(self, step, arrays, num_buckets=None):
    def write(at):
      for name, value in arrays.items():
        tf.summary.histogram(name, np.asarray(value), step=at,
                             buckets=(num_buckets or {}).get(name))
    self._eager(step, write)

  def write_texts(self, step, texts):
    def write(at):
      for name, text in texts.items():
        tf.summary.text(name, tf.constant(text), step=at)
    self._eager(step, write)

  def write_hparams(self, hparams):
    self._eager(0, lambda at: hp.hparams(dict(hparams)))

  def flush(self):
    with self._refused():
      self._writer.flush()

  def close(self):
    """Each write was flushed as it was made, so only a write that already
    failed (and ended the run in its one line) can fail here again: that
    is not raised a second time."""
    try:
      self._writer.close()
    except tf.errors.OpError as e:
      if files.storage_refused(e) is None:
        raise


class MetricsLine(Writer):
  """Scalars as `kind` lines of metrics.jsonl (`log`: the run's); a
  refused write ends in one line naming the workdir."""

  def __init__(self, log: jsonl.MetricsLog, kind: str,
               wd: workdir_lib.Workdir):
    self._log, self._kind, self._wd = log, kind, wd

  def write_scalars(self, step, scalars):
    with files.on_full_disk(self._wd.root, "metrics.jsonl",
                            self._wd.checkpoints):
      self._log.write(self._kind, step, scalars)
