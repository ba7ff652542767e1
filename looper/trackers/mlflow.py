"""MLflow as an experiment tracker: one MLflow run per workdir, across restarts.

Synopsis::

    MLFLOW_TRACKING_URI=http://127.0.0.1:5000 MLFLOW_EXPERIMENT_NAME=mnist \\
      looper train --config=experiments/mnist.py --workdir=/tmp/mnist \\
      --config.trackers=mlflow

    tracker = mlflow.MLflow(wd)   # a server that does not answer: one line
    # then as every tracker (looper.trackers.delivery): open, write_*,
    # start, deliver, close

Where: the store MLFLOW_TRACKING_URI names, else the workdir's `mlflow.db`
(sqlite) with artifacts in its `mlruns/` (MLflow's own default is
./mlflow.db in the current folder). The experiment: MLFLOW_EXPERIMENT_ID,
MLFLOW_EXPERIMENT_NAME (made if missing), or 'Default' on a server and
'looper' in the workdir's store.

What goes there: the run is named after the workdir (tag `looper.workdir`),
nested under its group's parent run when `config.trackers_group` is set
(a sweep's trials under their study's: looper.trackers; the parent is the
run tagged `looper.group_parent`, adopted by every later run),
its id kept in the workdir (an attempt killed after making the run but
before keeping its id: the rerun finds the run by its tag `looper.token`,
a token the workdir kept before making it, and adopts it: never a second
run); params: the resolved config's fields, dotted (`train.steps`).
Params cannot change in MLflow: a rerun that changes a field (a larger
`train.steps`) records it as the tag `changed/<field>` with the new value
(the param keeps the first), said in one line; fields new to the run
become params. Metrics: every line of metrics.jsonl at its step
and time (`train/loss`, `eval/accuracy`, an action's names), and at the
last step the run's final figures (the HParams' `hparams/...` columns and
`goodput/...`). Images: `log_image` at their step, one per image
(`name/<i>` when several); texts: artifacts `texts/<name>/step-<N>.txt`;
histograms are not sent (MLflow has no such kind). Images and texts are
kept in the workdir until sent (looper.trackers.delivery): a rerun after
a kill sends those it lacks (an image found among the run's artifacts is
not sent again; a text replaces its own file). Status: RUNNING while
an attempt trains, then FINISHED, KILLED (stopped: a rerun resumes it) or
FAILED.

A server that does not answer: MLflow's client retries a request for
minutes by default (7 retries, backoff 2, a 120 s timeout). Unless those
variables are set, looper asks once with no retry and a 5 s timeout before
training (`PREFLIGHT`: one line within seconds), and sends with one retry
and 10 s (`SENDING`): a server that dies mid-run costs seconds per
checkpoint, not minutes. Its lines are looper's (one when sends start
failing, one when they go through again, the closing line): MLflow's own
loggers, alembic's, urllib3's ("Retrying ...") and MLflow's "View run"
prints are quiet during looper's calls (`calling`).

A store a kill left half-made: MLflow makes the workdir's mlflow.db in
steps (its tables, then ~100 migrations, each stamped as it ends), and a
store killed between a migration's tables and its stamp fails every later
open ("table experiment_tags already exists"). Such a store (not at
MLflow's latest schema, holding no run) is removed and made again; the
run then made is sent every line of metrics.jsonl.
"""

import contextlib
import logging as std_logging
import os
import re
import sqlite3
import uuid

from absl import logging
import mlflow
from mlflow import entities
from mlflow.store.db import utils as db_utils

from looper import errors
from looper import workdir as workdir_lib
from looper.trackers import delivery
from looper.workdir import files

# MLflow's HTTP client reads these per request.
PREFLIGHT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
SENDING = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
           "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# Set during every call too: MLflow prints a "View run ... at: <url>" line on
# stdout when a run against a server ends.
QUIET_ENV = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
# Whose log lines are quiet during a call: MLflow's ("Creating initial MLflow
# database tables..."), its migrations' and urllib3's, whose "Retrying
# (Retry(total=0, ...))" warnings would fill the screen while a server is
# away (looper says it once).
QUIET = ("mlflow", "alembic", "sqlalchemy", "urllib3")
# MLflow's limits: per log_batch request, and a param's length.
METRICS_PER_BATCH, PARAMS_PER_BATCH, PARAM_LENGTH = 1000, 100, 6000
# The file of an image `log_image` stored: its key ('/' as '~'; '#' and
# '%' in older MLflow), its step.
IMAGE = re.compile(r"images/(.+?)[+%]step[+%](\d+)[+%]timestamp[+%].*\.png")


@contextlib.contextmanager
def calling(values: dict[str, str]):
  """A block of MLflow calls: its requests with `values` (and QUIET_ENV)
  where the user set none, the QUIET loggers silent."""
  mine = {k: v for k, v in {**values, **QUIET_ENV}.items()
          if k not in os.environ}
  os.environ.update(mine)
  loggers = [std_logging.getLogger(name) for name in QUIET]
  levels = [logger.level for logger in loggers]
  for logger in loggers:
    logger.setLevel(std_logging.CRITICAL + 1)
  try:
    yield
  finally:
    for name in mine:
      os.environ.pop(name, None)
    for logger, level in zip(loggers, levels):
      logger.setLevel(level)


def image_key(name: str, i: int, count: int) -> str:
  """The key of image `i` of `count` written as `name`."""
  return name if count == 1 else f"{name}/{i}"


def half_made(path: str) -> bool:
  """Whether the sqlite store at `path` is one MLflow began and a kill cut
  short: holding no run, not at MLflow's latest schema. (Reading it rolls
  back the transaction the kill interrupted, if any.)"""
  try:
    with contextlib.closing(sqlite3.connect(path)) as db:
      tables = {name for (name,) in db.execute(
          "SELECT name FROM sqlite_master WHERE type = 'table'")}
      if "runs" in tables and db.execute(
          "SELECT COUNT(*) FROM runs").fetchone()[0]:
        return False
      stamp = (db.execute("SELECT version_num FROM alembic_version").fetchone()
               if "alembic_version" in tables else None)
  except sqlite3.DatabaseError:
    return False  # not a store MLflow began: MLflow's error says what it is
  # MLflow's own check of a store's schema (`_verify_schema`) reads this;
  # private, so the extra pins mlflow<4 (pyproject.toml).
  latest = db_utils._get_latest_schema_revision()  # pylint: disable=protected-access
  return (stamp or [None])[0] != latest


def _oldest(runs) -> str:
  return min(runs, key=lambda r: (r.info.start_time, r.info.run_id)
             ).info.run_id


class MLflow(delivery.Tracker):
  """MLflow's run of the workdir `wd` (see module doc)."""
  name = "mlflow"
  KEEPS = ("images", "texts")

  def __init__(self, wd: workdir_lib.Workdir, group: str = ""):
    super().__init__(wd, group)
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    self._local = not uri
    if self._local:
      if not workdir_lib.posix(wd.root):
        raise errors.ConfigError(
            f"config.trackers='mlflow': MLflow's local store (sqlite) cannot"
            f" be in --workdir={wd.root}, an object store; set"
            " MLFLOW_TRACKING_URI to a tracking server")
      uri = "sqlite:///" + os.path.abspath(wd.mlflow_db)
    self.uri = uri
    # The workdir's store is made (or checked) when the run opens: after the
    # workdir is, and quietly (`calling`).
    self._client = None if self._local else mlflow.MlflowClient(uri)
    self._experiment = self._run = None
    self._stored = set()  # (key, step) of the run's images, when asked
    if uri.startswith(("http://", "https://")):
      try:
        with calling(PREFLIGHT):
          self._client.search_experiments(max_results=1)
      except Exception as e:  # pylint: disable=broad-except
        raise errors.ConfigError(
            f"config.trackers='mlflow': the MLflow server at {uri}"
            f" (MLFLOW_TRACKING_URI) does not answer"
            f" ({errors.first_line(e)}); start it, or set"
            " MLFLOW_TRACKING_URI to one that runs") from None

  def where(self) -> str:
    return f"run {self._run} in {self.uri} (experiment {self._experiment})"

  def _open(self, run_id, params):
    with calling(SENDING):
      if self._local:
        self._client = self._local_store()
      run = self._kept(run_id) if run_id else None
      if run is None:
        run = self._made()
      elif run.info.status != "RUNNING":
        self._client.update_run(run.info.run_id, status="RUNNING")
      self._experiment, self._run = run.info.experiment_id, run.info.run_id
      self._params(params, logged=run.data.params)
      return self._run

  def _local_store(self) -> mlflow.MlflowClient:
    """A client of the workdir's store, made now if missing, made again if
    a kill left it half made (it held no run)."""
    path = self._wd.mlflow_db
    if os.path.exists(path) and half_made(path):
      files.remove(path)
      logging.info("mlflow: %s was left half made (killed while MLflow made"
                   " its tables; no run in it): made again", path)
    return mlflow.MlflowClient(self.uri)

  def _kept(self, run_id: str):
    """The run `run_id` (kept in the workdir); None (a line) if it cannot
    be read: deleted, or its store was made again."""
    try:
      return self._client.get_run(run_id)
    except mlflow.exceptions.MlflowException as e:
      logging.warning("mlflow: run %s (kept in %s) cannot be read (%s);"
                      " starting a new run", run_id,
                      self._wd.tracker(self.name), errors.first_line(e))
      return None

  def _made(self):
    """The workdir's run an attempt made and was killed before keeping its
    id (found by the token it kept before making it), else a new one."""
    self._experiment = self._experiment_id()
    token = self._state.get("token")
    if token:
      found = self._client.search_runs(
          [self._experiment], f"tags.`looper.token` = '{token}'")
      if found:
        return found[0]
    else:
      self._state["token"] = token = uuid.uuid4().hex
      self._save()
    tags = {"looper.workdir": self._wd.root, "looper.token": token}
    if self._group:
      tags.update({"looper.group": self._group,
                   "mlflow.parentRunId": self._group_run()})
    return self._client.create_run(
        self._experiment, run_name=os.path.basename(self._wd.root.rstrip(
            "/")), tags=tags)

  def _group_run(self) -> str:
    """The id of the group's parent run in the experiment: the oldest
    found, else one made now. Two runs that both found none (two sweep
    workers' first trials) both make one, then both keep the oldest and
    the maker of the other deletes it: one parent either way."""
    query = (f"tags.`looper.group_parent` = '{self._group}'")
    found = self._client.search_runs([self._experiment], query)
    if found:
      return _oldest(found)
    made = self._client.create_run(
        self._experiment, run_name=self._group,
        tags={"looper.group_parent": self._group})
    self._client.set_terminated(made.info.run_id)  # holds only its children
    kept = _oldest(self._client.search_runs([self._experiment], query))
    if kept != made.info.run_id:
      self._client.delete_run(made.info.run_id)
    return kept

  def _experiment_id(self) -> str:
    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
      return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or (
        "looper" if self._local else "")
    if not name:
      return "0"  # the server's 'Default'
    found = self._client.get_experiment_by_name(name)
    if found:
      return found.experiment_id
    return self._client.create_experiment(
        name, artifact_location=("file://" + os.path.abspath(
            self._wd.mlflow_artifacts)) if self._local else None)

  def _params(self, params, logged=None):
    """New fields as params; changed ones as tags `changed/<field>`."""
    with calling(SENDING):
      if logged is None:
        logged = self._client.get_run(self._run).data.params
      params = {k: v[:PARAM_LENGTH] for k, v in params.items()}
      new = [entities.Param(k, v) for k, v in params.items()
             if k not in logged]
      changed = {k: v for k, v in params.items()
                 if k in logged and logged[k] != v}
      tags = [entities.RunTag(f"changed/{k}", v) for k, v in changed.items()]
      for items in (new, tags):
        for i in range(0, len(items), PARAMS_PER_BATCH):
          chunk = items[i:i + PARAMS_PER_BATCH]
          self._client.log_batch(
              self._run, params=chunk if items is new else [],
              tags=chunk if items is tags else [])
    if changed:
      logging.info(
          "mlflow: fields changed since run %s logged its params, recorded"
          " as tags changed/<field> (MLflow's params cannot change): %s",
          self._run, ", ".join(f"{k}={v} (param: {logged[k]})"
                               for k, v in sorted(changed.items())))

  def _send(self, points):
    metrics = [entities.Metric(k, v, int(p.time * 1000), p.step)
               for p in points if p.kind in ("scalars", "figures")
               for k, v in p.values.items()]
    with calling(SENDING):
      for i in range(0, len(metrics), METRICS_PER_BATCH):
        self._client.log_batch(self._run,
                               metrics=metrics[i:i + METRICS_PER_BATCH])
      for p in points:
        if p.kind == "images":
          for name, images in p.values.items():
            for i, image in enumerate(images):
              key = image_key(name, i, len(images))
              if (key, p.step) not in self._stored:  # some of them sent
                self._client.log_image(
                    self._run, image[..., 0] if image.shape[-1] == 1 else
                    image, key=key, step=p.step,
                    timestamp=int(p.time * 1000))
        elif p.kind == "texts":
          for name, text in p.values.items():
            self._client.log_text(self._run, text,
                                  f"texts/{name}/step-{p.step}.txt")

  def _held(self, points):
    held = set()
    with calling(SENDING):
      for key in {k for p in points if p.kind in ("scalars", "figures")
                  for k in p.values}:
        held |= {(key, m.step)
                 for m in self._client.get_metric_history(self._run, key)}
      images = [p for p in points if p.kind == "images"]
      if images:
        self._stored = {
            (re.sub("[~#]", "/", match.group(1)), int(match.group(2)))
            for a in self._client.list_artifacts(self._run, "images")
            if (match := IMAGE.fullmatch(a.path))}
    # An image name is held when each of its images is.
    return held | {(name, p.step) for p in images
                   for name, value in p.values.items()
                   if all((image_key(name, i, len(value)), p.step)
                          in self._stored for i in range(len(value)))}

  def _finish(self, status):
    with calling(SENDING):
      self._client.set_terminated(self._run, status)
