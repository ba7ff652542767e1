"""One attempt at a mode in a workdir, around the Controller: `Attempt`.

Synopsis (what looper.run.Run.run does once the pieces are built)::

    attempt = Attempt(checkpointer, summaries, workdir, trackers=trackers,
                      config_json=references.to_json(config),
                      ledger=goodput.Ledger(workdir, started=started),
                      watchers=[signals.StopOnSignal(stop.request),
                                vm_notices.WatchNotices(stop.request)])
    with attempt.running():                # the trackers' runs opened
      ...                                  # the evaluation, the Controller
      result = attempt.run("train", controller, evaluation,
                           model_text=summaries.model_summary(model))

An attempt is one process' run of a mode (looper.measure.goodput adds the
attempts of a run up). The modes are the Controller's (eval,
continuous_eval, train, train_and_eval; export: looper.modes); what
surrounds its training is here:

    open the trackers' runs (looper.trackers)
    a fresh start's config and model summary to TensorBoard
    train, while the watchers may ask the loop to stop (a signal:
        looper.control.signals; a Google Cloud VM's notice: vm_notices)
    wait for the last save (timed: the ledger's checkpoint time)
    the ledger's last record, its figures to TensorBoard, the trackers'
        runs closed as FINISHED or KILLED, the closing lines (console)
    on an error: the save in flight waited for, the ledger's failed record,
        the trackers' runs FAILED, the error raised
    the writers closed, whatever happened

The goodput ledger and the closing lines are the chief's of a training
run; an evaluation's attempt only closes its writers.
"""

import contextlib
import time
from typing import Sequence

from absl import logging

from looper import console
from looper import trackers as trackers_lib
from looper import workdir as workdir_lib
from looper.measure import goodput


class Attempt:
  """A mode's run once its pieces are built (see module doc).

  Args:
    checkpointer: the run's `looper.workdir.checkpoint.Checkpointer` (its
      save in flight; what is durable).
    summaries: the run's `looper.workdir.summaries.Summaries`, closed at
      the end.
    workdir: the run's `looper.workdir.Workdir` (the closing lines).
    trackers: the experiment trackers (looper.trackers) whose runs this
      opens and closes; [] on other workers and modes.
    config_json: the resolved config, the trackers' params.
    ledger: the goodput ledger (the chief's, of a training run); None.
    watchers: contexts that ask the train loop to stop while it runs.
  """

  def __init__(self, checkpointer, summaries, workdir: workdir_lib.Workdir,
               *, trackers: list, config_json: str,
               ledger: goodput.Ledger | None = None,
               watchers: Sequence[contextlib.AbstractContextManager] = ()):
    self._ckpt, self._out, self._wd = checkpointer, summaries, workdir
    self._trackers, self._config_json = trackers, config_json
    self._ledger, self._watchers = ledger, watchers

  @contextlib.contextmanager
  def running(self):
    """A context for the mode: the trackers' runs opened; on an error, what
    is in flight ended and recorded as failed; the writers closed."""
    try:
      trackers_lib.open_runs(self._trackers, self._config_json)
      yield self
    except Exception as e:
      # A background save in flight ends before the process does: what it
      # met (the full disk that stopped the run) is raised here, not lost in
      # a traceback at exit after looper's line.
      self._ckpt.wait()
      if self._ledger:
        self._ledger.close_failed(e)
      trackers_lib.close_runs(self._trackers, self._ckpt.durable_step,
                              failed=True)
      raise
    finally:
      self._out.close()

  def run(self, mode: str, controller, evaluation, *,
          checkpoint_path: str | None = None, timeout_secs: float = 0.0,
          model_text: str | None = None) -> dict:
    """Runs `mode` through `controller` (looper.control.controller);
    `evaluation`: the run's `looper.control.eval_action.EvalAction`.
    `checkpoint_path`: --mode=eval's checkpoint (default: the latest);
    `timeout_secs`: continuous_eval's wait for a new checkpoint;
    `model_text`: a fresh start's model summary (its config and model go
    to TensorBoard first: looper.workdir.summaries); None on a resume."""
    if mode == "eval":
      return controller.evaluate(evaluation.evaluate, checkpoint_path)
    if mode == "continuous_eval":
      return controller.continuous_eval(evaluation.evaluate,
                                        timeout_secs=timeout_secs)
    if model_text is not None:
      self._out.start_run(self._config_json, model_text)
    with contextlib.ExitStack() as watching:  # they ask the loop to stop
      for watcher in self._watchers:
        watching.enter_context(watcher)
      result = (controller.train_and_eval() if mode == "train_and_eval"
                else controller.train())
    waited = time.monotonic()
    self._ckpt.wait()
    if self._ledger:
      self._ledger.add("checkpoint", time.monotonic() - waited)
      totals = self._ledger.close(goodput.how_it_ended(result))
      self._out.goodput(result["step"], totals.fractions())
      closed = trackers_lib.close_runs(
          self._trackers, self._ckpt.durable_step,
          stopped=result.get("stopped"), figures=self._out.figures)
      # The attempt's time as its record holds it: `looper runs` adds up
      # the records (its "wall (all attempts)"), so one attempt agrees.
      logging.info("%s", console.summary(
          result, self._wd, self._ledger.wall, best=evaluation.best,
          checkpoint=self._ckpt.latest(), export=result.get("export"),
          goodput=totals.line(), trackers=closed))
    return result
