"""A sweep worker: asks the study for trials, runs P at once, reports, prunes, resumes.

Synopsis::

    w = worker.Worker(study, storage, spec, options, starter)
    code = w.run()     # until the study holds --trials finished trials

    while the study lacks trials or one is orphaned:
      take a RUNNING trial whose worker is gone (claims), else ask a new one
      start it (looper.sweep.trials) in DIR/trials/<its first number>
      read its eval lines: report the objective at each new step; if the
      pruner says so, SIGTERM it (looper saves and stops): PRUNED
      it ended: 0 -> COMPLETE with its last evaluation; killed (SIGKILL,
      e.g. the OOM killer) -> restarted from its checkpoint; its one
      `looper:` line -> FAIL with that line, the sweep goes on

Trials never open the study: the parent reads each evaluation from the
trial's metrics.jsonl, so a trial needs no database driver, no
connection and no Optuna (BUILD.md "Sweeps"). A pruned trial stops at the
first step boundary after the signal, so within one evaluation period of
the decision. The objective must be in the first evaluation: until one
trial of the study has reported it, no second trial starts, and a trial
whose eval line lacks it stops the sweep in one line naming what it has.

On SIGTERM or SIGINT the worker passes SIGTERM to its trials (each saves
at its step) and exits, leaving them RUNNING for the next worker; under
Slurm, SIGUSR1 (`#SBATCH --signal=B:USR1@120`) or the job's end time
coming within `slurm_margin_secs` (looper.sweep.slurm) does the same and
then requeues the job, whose rerun resumes each trial exactly.
"""

import dataclasses
import os
import signal
import time

import optuna

from looper.sweep import claims
from looper.sweep import report
from looper.sweep import slurm
from looper.sweep import space as space_lib
from looper.sweep import study as study_lib
from looper.sweep import trials
from looper.workdir import holders

TrialState = optuna.trial.TrialState
POLL_SECS = 0.05  # a trial's end is seen within; a poll reads one small file
RESTARTS = 3  # a trial killed by a signal not ours: resumed this often


@dataclasses.dataclass
class Options:
  """The command line of `looper sweep` (looper.cli.sweep)."""
  config: str
  sweep_dir: str
  overrides: list
  trials: int
  parallel: int = 1
  devices_per_trial: int = 1
  seed: int | None = None
  sampler: str = "tpe"
  pruner: str = "median"
  max_failures: int = 3
  lease_secs: float = 60.0
  slurm_margin_secs: float = 0.0


@dataclasses.dataclass
class _Run:
  """A trial this worker runs."""
  trial: optuna.Trial
  params: dict
  folder: str
  claim: claims.Claim
  slot: int
  reported: set
  proc: object = None
  pruned_at: int | None = None
  restarts: int = 0


def say(line: str) -> None:
  print(f"{time.strftime('%H:%M:%S')} looper sweep: {line}", flush=True)


class Worker:
  """One `looper sweep` process (module doc)."""

  def __init__(self, study: optuna.Study, storage, spec: dict,
               options: Options, starter, slots=None):
    self.study, self.spec, self.o, self.starter = study, spec, options, starter
    self.storage = storage  # the study's (study_lib.trial_of)
    self.key = space_lib.metric_key(spec["objective"])
    self.slots = slots or trials.slots(options.parallel,
                                       options.devices_per_trial)
    self.running: list[_Run] = []
    self.failures = 0  # in a row
    self.fatal: str | None = None
    self.stopping = False
    self.requeue = False
    self.deadline = slurm.end_time() if options.slurm_margin_secs else None
    self.flags = [*options.overrides,
                  *trials.study_flags(spec, study.study_name)]

  def folder(self, number) -> str:
    return os.path.join(self.o.sweep_dir, "trials", str(number))

  def command(self, folder: str, params: dict) -> list[str]:
    return trials.command(self.o.config, folder,
                          [*self.flags, *trials.params_flags(params)])

  def _signal(self, signum, _) -> None:
    self.stopping = True
    self.requeue = self.requeue or signum == signal.SIGUSR1
    for run in self.running:
      if run.proc is not None:
        run.proc.send_signal(signal.SIGTERM)

  def run(self) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
      signal.signal(sig, self._signal)
    while True:
      if (self.deadline and not self.stopping and
          time.time() > self.deadline - self.o.slurm_margin_secs):
        say("the Slurm job ends in under --slurm_margin_secs: saving the"
            " trials, then requeueing the job")
        self._signal(signal.SIGUSR1, None)
      for run in list(self.running):
        self._watch(run)
      if not (self.stopping or self.fatal):
        self._fill()
      if not self.running:
        break
      time.sleep(POLL_SECS)
    if self.requeue:
      slurm.requeue()
    return 1 if self.fatal else 0

  def _objective_seen(self) -> bool:
    return any(t.intermediate_values or t.state == TrialState.COMPLETE
               for t in self.study.get_trials(deepcopy=False))

  def _fill(self) -> None:
    while len(self.running) < self.o.parallel:
      if self.running and not self._objective_seen():
        return  # the first evaluation checks the objective (module doc)
      run = self._next()
      if run is None:
        return
      self.running.append(run)
      self._start(run)

  def _next(self) -> _Run | None:
    """A trial to run: an orphaned one, else a new one (under the lock)."""
    mine = {r.trial.number for r in self.running}
    slot = min(set(range(self.o.parallel)) - {r.slot for r in self.running})
    with claims.locked(self.o.sweep_dir):
      known = self.study.get_trials(deepcopy=False)
      for t in known:
        folder = self.folder(t.user_attrs.get("folder", t.number))
        if (t.state == TrialState.RUNNING and t.number not in mine and
            claims.free(folder, self.o.lease_secs)):
          claim = claims.Claim.take(folder, self.o.lease_secs, t.number)
          say(f"trial {t.number}: its worker is gone; resuming it from its"
              f" checkpoint in {folder}")
          return _Run(study_lib.trial_of(self.study, self.storage, t.number),
                      t.params, folder, claim, slot,
                      set(t.intermediate_values))
      if len(known) >= self.o.trials:
        return None
      trial, params = study_lib.ask(self.study, self.spec["space"],
                                    sampler=self.o.sampler, seed=self.o.seed)
      trial.set_user_attr("folder", trial.number)
      folder = self.folder(trial.number)
      claim = claims.Claim.take(folder, self.o.lease_secs, trial.number)
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in params.items())
    say(f"trial {trial.number} ({shown}) in {folder}")
    return _Run(trial, params, folder, claim, slot, set())

  def _start(self, run: _Run) -> None:
    """Starts the trial's looper run, unless a process of an earlier
    worker still holds its workdir (then at a later poll)."""
    holder = claims.read_json(os.path.join(run.folder, "lease.json"))
    if holder and not holders.stale(holder, self.o.lease_secs):
      return
    log = os.path.join(run.folder, "trial.log")
    run.proc = self.starter.start(
        self.command(run.folder, run.params), **trials.launch(
            self.slots[run.slot]), stdout=log, stderr=log)
    run.claim.set_process(run.proc.pid)
    self._record(run)
    if len(self.study.get_trials(deepcopy=False)) < self.o.trials:
      trials.prepare(self.starter, self.slots[run.slot])  # the slot's next

  def _record(self, run: _Run) -> None:
    report.write_trial(run.folder, study_lib.frozen(self.study,
                                                    run.trial.number),
                       self.spec)

  def _watch(self, run: _Run) -> None:
    if run.proc is None:
      if not self.stopping:
        self._start(run)
      if run.proc is None:
        if self.stopping:
          self._leave(run)
        return
    if run.pruned_at is None and not self.stopping:
      self._report(run)
    code = run.proc.poll()
    if code is not None:
      self._ended(run, code)

  def _report(self, run: _Run) -> None:
    for step, line in trials.evaluations(run.folder):
      if step in run.reported:
        continue
      if self.key not in line:
        has = ", ".join(k for k in line if k not in ("kind", "step", "time"))
        self.fatal = (
            f"objective {self.spec['objective']!r} is not in trial"
            f" {run.trial.number}'s evaluations (they hold {has}); name one"
            " of those in get_sweep(), as eval/<metric> or <set>/<metric>")
        say(self.fatal)
        self._signal(signal.SIGTERM, None)
        return
      run.trial.report(line[self.key], step)
      run.reported.add(step)
      if run.trial.should_prune():
        run.pruned_at = step
        run.proc.send_signal(signal.SIGTERM)
        say(f"trial {run.trial.number} pruned at step {step}:"
            f" {self.spec['objective']}={line[self.key]:.4g} ({self.o.pruner}"
            " pruner); it saves and stops")
        return

  def _ended(self, run: _Run, code: int) -> None:
    number = run.trial.number
    if run.pruned_at is not None:
      self._tell(run, state=TrialState.PRUNED)
      self.failures = 0
      return
    if self.stopping:
      self._leave(run)
      return
    early = code == 0 and trials.stopped_early(run.folder)
    if (code < 0 or early) and run.restarts < RESTARTS:  # resumed in place
      run.restarts += 1
      why = "stopped early" if early else f"was killed (signal {-code})"
      say(f"trial {number} {why}; resuming it from its checkpoint (restart"
          f" {run.restarts} of {RESTARTS})")
      run.proc = None
      return
    evals = trials.evaluations(run.folder)
    if code == 0 and evals and self.key in evals[-1][1]:
      value = evals[-1][1][self.key]
      self._tell(run, values=value)
      self.failures = 0
      say(f"trial {number} complete: {self.spec['objective']}={value:.4g} at"
          f" step {evals[-1][0]}")
      return
    error = trials.last_error(os.path.join(run.folder, "trial.log")) or (
        f"it ended with status {code}" + ("" if evals else
                                          " without an evaluation"))
    run.trial.set_user_attr("error", error)
    self._tell(run, state=TrialState.FAIL)
    self.failures += 1
    say(f"trial {number} failed: {error}")
    if self.failures >= self.o.max_failures:
      self.fatal = (f"{self.failures} trials failed in a row, the last"
                    f" (trial {number}): {error}; fix that, or raise"
                    " --max_failures")
      say(self.fatal)

  def _tell(self, run: _Run, **kwargs) -> None:
    self.study.tell(run.trial, **kwargs)
    self._record(run)
    self._leave(run)

  def _leave(self, run: _Run) -> None:
    run.claim.release()
    self.running.remove(run)
