"""The workdir: one object naming every path a run reads or writes.

This package holds what is written there, a module each: `files` (how
any file is written; the one line for a full disk), `checkpoint` (saves,
restores, the best one) with `contents` (what a checkpoint holds; warm
starts from another run's), `lease` (one writer per workdir), `summaries`
(the writers composed: TensorBoard events, the lines) with `writers`,
`jsonl` (metrics.jsonl), `lines` (the train and eval lines a run prints),
`formats` (how a value prints) and `hparams` (the HParams row), `spool`
(a tracker's media until it holds them), `export` (a SavedModel for
serving). They, and the profiler window (looper.control.profiler), take
their paths from the `Workdir` defined here.

Synopsis::

    wd = workdir.Workdir("/tmp/mnist")        # or gs://bucket/mnist
    wd.checkpoints          # /tmp/mnist/checkpoints
    wd.metrics              # /tmp/mnist/metrics.jsonl
    wd.export_version(500)  # /tmp/mnist/export/500

Layout (every name is spelled here and nowhere else)::

    config.json            the resolved config (a training run's chief)
    lease.json             who writes here now (lease)
    metrics.jsonl          a line per train loop and evaluation (jsonl); on
                           an object store a folder of parts <N>.jsonl
    checkpoints/           ckpt-<step>.* and TensorFlow's `checkpoint` index
      best/                the best evaluation's checkpoint, history.json
    train/ eval/           TensorBoard events of training and evaluation
      plugins/profile/     (under train/) a profiler trace (TensorFlow's
                           layout: looper gives it train/)
    eval_continuous/       events of --mode=continuous_eval
    hparams/               the run's row of TensorBoard's HParams table
    goodput/attempt-<N>.json  where training attempt N's time went
                           (looper.measure.goodput)
    trackers/<name>.json   an experiment tracker's run id and delivered
                           step (looper.trackers)
    trackers/<name>-media/ its images, histograms and texts until it holds
                           them, a file per write (spool)
    mlflow.db, mlruns/     MLflow's store and artifacts, and wandb/, W&B's
                           folder, when their variables name none
    export/<step>/         a SavedModel for serving; written as
                           export/.partial-<step>/ and renamed into place
                           (file by file on an object store, saved_model.pb
                           last)
    .worker<N>_checkpoints/  scratch: task N's copy of a save under
                           multi-worker (only the chief's is kept)

Paths are strings joined with os.path.join, read and written through
tf.io.gfile: the same on a local disk and on object stores (gs://, s3://;
ram:// in the tests). Every file looper itself writes goes through
`files` (TensorFlow writes checkpoints, events, SavedModels and traces),
the way that holds on each store (`posix` tells them apart); a write the
storage refuses ends in its one line.
"""

import dataclasses
import os


def posix(path: str) -> bool:
  """Whether `path` is a local path, on a file system that renames a
  folder at once, appends to a file in place and makes a hard link
  exclusively; a path with a scheme (gs://, s3://, ram://) is taken for an
  object store."""
  return "://" not in path


@dataclasses.dataclass(frozen=True)
class Workdir:
  """The paths of the run in `root` (see module doc)."""
  root: str

  def _path(self, *names: str) -> str:
    return os.path.join(self.root, *names)

  @property
  def config(self) -> str:
    return self._path("config.json")

  @property
  def lease(self) -> str:
    return self._path("lease.json")

  @property
  def metrics(self) -> str:
    return self._path("metrics.jsonl")

  @property
  def checkpoints(self) -> str:
    """The chief's checkpoints: what restore, eval and export read."""
    return self.checkpoint_saves()[0]

  @property
  def best_checkpoints(self) -> str:
    return self.checkpoint_saves()[1]

  @property
  def best_history(self) -> str:
    """The evaluated values of checkpoint.best_metric (looper.control.eval_action)."""
    return os.path.join(self.best_checkpoints, "history.json")

  def checkpoint_saves(self, task_id: int | None = None) -> tuple[str, str]:
    """(rolling, best) checkpoint directories of the chief (None) or of
    task `task_id`: under multi-worker every task writes each save (it is
    a collective); the others' copies go to scratch, removed once written."""
    rolling = (self._path("checkpoints") if task_id is None else
               self._path(f".worker{task_id}_checkpoints"))
    return rolling, os.path.join(rolling, "best")

  @property
  def train_events(self) -> str:
    return self._path("train")

  @property
  def eval_events(self) -> str:
    """Events of the evaluations of train_and_eval and --mode=eval."""
    return self._path("eval")

  @property
  def continuous_eval_events(self) -> str:
    """Events of --mode=continuous_eval, beside a training run's."""
    return self._path("eval_continuous")

  @property
  def hparams_events(self) -> str:
    return self._path("hparams")

  @property
  def goodput(self) -> str:
    return self._path("goodput")

  def goodput_attempt(self, attempt: int | str) -> str:
    """Attempt `attempt`'s record (a glob pattern for "*")."""
    return os.path.join(self.goodput, f"attempt-{attempt}.json")

  def tracker(self, name: str) -> str:
    """The state of experiment tracker `name` (looper.trackers.delivery)."""
    return self._path("trackers", f"{name}.json")

  def tracker_media(self, name: str) -> str:
    """Tracker `name`'s images, histograms and texts until it holds them
    (looper.workdir.spool)."""
    return self._path("trackers", f"{name}-media")

  @property
  def mlflow_db(self) -> str:
    """MLflow's store when MLFLOW_TRACKING_URI names none..."""
    return self._path("mlflow.db")

  @property
  def mlflow_artifacts(self) -> str:
    """...and its artifacts (images, texts)."""
    return self._path("mlruns")

  @property
  def profile(self) -> str:
    """Where TensorFlow's profiler puts a trace when given `train_events`."""
    return os.path.join(self.train_events, "plugins", "profile")

  @property
  def export(self) -> str:
    """SavedModels by step: the versioned layout TF Serving watches."""
    return self._path("export")

  def export_version(self, step: int) -> str:
    return os.path.join(self.export, str(step))

  def export_partial(self, step: int) -> str:
    """Where the export of `step` is written before it is renamed into
    place; hidden, so TF Serving never loads half of one."""
    return os.path.join(self.export, f".partial-{step}")
