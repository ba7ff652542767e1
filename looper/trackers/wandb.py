"""Weights & Biases as an experiment tracker: one W&B run per workdir, across restarts.

Synopsis::

    WANDB_MODE=offline WANDB_PROJECT=mnist looper train \\
      --config=experiments/mnist.py --workdir=/tmp/mnist --config.trackers=wandb
    wandb sync /tmp/mnist/wandb/offline-run-*     # later, to the server

    tracker = wandb.WandB(wd)
    # then as every tracker (looper.trackers.delivery): open, write_*,
    # start, deliver, close

Configured by W&B's own variables (WANDB_MODE, WANDB_PROJECT, WANDB_DIR,
WANDB_API_KEY, ...); its folder is the workdir's `wandb/` unless WANDB_DIR
names another (W&B's own default is ./wandb in the current folder).

What goes there: the run (its id kept in the workdir, resumed with
`resume="allow"`) named after the workdir, in `config.trackers_group`'s
group if set (a sweep's trials: the study's); its config: the resolved
config's fields, dotted, and `looper.workdir`; a rerun that changes a
field updates it there (W&B's config holds the latest value), said in one
line. History: every line of metrics.jsonl at its step (`train/loss`,
`eval/accuracy`, an action's names), images (`wandb.Image`), histograms
(`wandb.Histogram`) and texts, a step's together; the final figures (the
HParams' `hparams/...` columns, `goodput/...`) in the run's summary.

What a kill -9 leaves (looper.trackers.wandb_files): `run.log()`
returns before W&B's own process writes the point to the run's `.wandb`
file, and that process dies with the run, so what looper handed over is
not what the run holds. The run's id is the workdir's before W&B makes
the run (a kill right after `wandb.init` leaves no second run), and every
restart waits for an earlier attempt's W&B process to let go of the
run's files, reads what they hold, and sends exactly the (key, step)
pairs of metrics.jsonl they lack; the final figures go to the summary
again (it keeps each key's latest value). Images, histograms and texts
are kept in the workdir (looper.trackers.delivery) until the run's files
show them (a restart reads them) or the run finished: a restart sends
those the files lack, a histogram rebuilt from its values.
Its sends are in the background, so a failure mid-run is W&B's to retry
and report, not looper's. Online W&B is not tested here (no network): an
online run without an API key fails as its run opens, in one line, before
training; online, W&B itself drops a step below the run's last one.
"""

import itertools
import os
import uuid

from absl import logging
import wandb

from looper import errors
from looper import workdir as workdir_lib
from looper.trackers import delivery
from looper.trackers import wandb_files
from looper.workdir import jsonl

# Buckets of a histogram written without `num_buckets` (TensorBoard's 30).
BINS = 30


class WandB(delivery.Tracker):
  """W&B's run of the workdir `wd` (see module doc)."""
  name = "wandb"
  KEEPS = ("images", "histograms", "texts")
  HELD_ON_SEND = False  # W&B's own process writes it later

  def __init__(self, wd: workdir_lib.Workdir, group: str = ""):
    super().__init__(wd, group)
    self._dir = os.environ.get("WANDB_DIR") or wd.root
    if not workdir_lib.posix(self._dir):
      raise errors.ConfigError(
          f"config.trackers='wandb': W&B writes its files in a local folder,"
          f" not in {self._dir} (an object store); set WANDB_DIR to a local"
          " folder")
    self._run = None
    self._holds = None  # (key, step) the run's files held at this start

  def where(self) -> str:
    return (f"run {self._state['run_id']} in {self._run.dir}"
            if self._run else f"run {self._state['run_id']}")

  def _open(self, run_id, params):
    if run_id:
      self._recount(run_id)
    else:  # kept before W&B makes the run: a kill after it resumes it
      run_id = self._state["run_id"] = uuid.uuid4().hex[:16]
      self._save()
    self._run = wandb.init(
        id=run_id, resume="allow", dir=self._dir,
        name=os.path.basename(self._wd.root.rstrip("/")),
        group=self._group or None,  # else WANDB_RUN_GROUP, if set
        # looper prints its own lines and writes its own config; W&B's
        # console capture, system sampling, git probe and pip freeze off.
        settings=wandb.Settings(console="off", x_disable_stats=True,
                                silent=True, disable_git=True,
                                save_code=False, x_save_requirements=False))
    self._params({**params, "looper.workdir": self._wd.root})
    return self._run.id

  def _recount(self, run_id):
    """A restart: what the run's files hold decides what is delivered.
    `delivered` becomes the step before metrics.jsonl's first (key, step)
    they lack; from there to the step the state says was handed to W&B,
    the first send leaves out what they hold (`_held`)."""
    files = wandb_files.paths(self._dir, run_id)
    wandb_files.wait_for_writers(files)
    self._holds = wandb_files.held(wandb_files.history(files))
    upto = self._state["delivered"]
    for line in jsonl.read(self._wd.metrics):
      if line["kind"] in jsonl.PREFIXES:
        if not all((k, line["step"]) in self._holds for k in jsonl.named(line)):
          upto = line["step"] - 1
          break
        upto = line["step"]
    claimed = max(self._state["delivered"], *(self._state["sending"] or [0]))
    self._state.update(delivered=upto, final=None,
                       sending=[upto + 1, claimed] if claimed > upto else None)

  def _held(self, points):
    return self._holds

  def _params(self, params):
    # What the run holds: W&B's copy online; offline (a new file per
    # attempt) what looper logged, kept in the workdir.
    held = {**self._state.get("params", {}), **dict(self._run.config)}
    changed = {k: v for k, v in params.items() if k in held and
               str(held[k]) != v}
    self._run.config.update(params, allow_val_change=True)
    self._state["params"] = {**held, **params}
    if changed:
      logging.info("wandb: fields changed since run %s logged its config,"
                   " updated there: %s", self._run.id, ", ".join(
                       f"{k}={v} (was {held[k]})"
                       for k, v in sorted(changed.items())))

  def _send(self, points):
    for step, group in itertools.groupby(points, key=lambda p: p.step):
      data = {}
      for p in group:
        if p.kind == "scalars":
          data.update(p.values)
        elif p.kind == "figures":
          self._run.summary.update(p.values)
        elif p.kind == "images":
          data.update({k: [wandb.Image(image) for image in v]
                       for k, v in p.values.items()})
        elif p.kind == "histograms":
          data.update({k: wandb.Histogram(
              v, num_bins=(p.buckets or {}).get(k, BINS))
                       for k, v in p.values.items()})
        else:  # texts
          data.update(p.values)
      if data:
        self._run.log(data, step=step)

  def _finish(self, status):
    self._run.finish(exit_code=0 if status != "FAILED" else 1)
