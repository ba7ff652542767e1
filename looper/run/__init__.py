"""Runs an experiment from its config: `run`, `Run`.

Synopsis (what `python -m looper.main` does, usable from a notebook)::

    from looper import run
    config = my_experiment.get_config()
    result = run.run(config, workdir="/tmp/exp", mode="train_and_eval")
    result["eval"]["accuracy"]
    # It prints what the command line prints (verbose=False: nothing).

    trainer = run.Run(config, "/tmp/exp").trainer   # built, nothing written

Modes: train, train_and_eval, eval, continuous_eval, export (what each
reads and writes: looper.modes.MODES; every path in `workdir` is named by
looper.workdir.Workdir).

| module | owns |
|---|---|
| `runner` | `Run`: each piece built once, in order, in an overridable `_build_*` method; then the mode |
| `pieces` | the step's pieces from the config: the Trainer and the options around its step, the Evaluator; checked on the data, restored |
| `attempt` | around the mode: the trackers' runs, the stop watchers, the last save, the goodput ledger's record, the closing lines |
"""

import ml_collections

from looper import console
from looper.run.runner import Run


def run(config: ml_collections.ConfigDict, workdir: str,
        mode: str = "train_and_eval", checkpoint_path: str | None = None,
        *, started: float | None = None, verbose: bool = True) -> dict:
  """Runs an experiment in `workdir`, resuming from its last checkpoint.

  Args:
    config: an experiment config (from `looper.config.default_config()`).
    workdir: where checkpoints, events and config.json go.
    mode: one of MODES (see module doc).
    checkpoint_path: for modes 'eval' and 'export', a checkpoint prefix to
      use instead of the latest.
    started: when the attempt started, on the `time.monotonic()` clock
      (looper.main: the process' start); default: now. Its goodput's
      start-up is counted from there (looper.measure.goodput).
    verbose: print the command line's lines (the header, each loop's
      progress line, evaluations, the closing summary) to stdout where
      logging shows none, as from plain Python or a notebook; False: quiet.
      Where logging shows absl's lines (looper.main, an absl app,
      `logging.basicConfig(level=logging.INFO)`) they go there, once;
      `absl.logging.set_verbosity("warning")` keeps them quiet too
      (looper.console.printing).

  Returns:
    {'step': the final step, 'train': the last loop's logs (if trained),
     'eval': the last evaluation's logs (if evaluated), 'export': the
     SavedModel's path (if exported), 'stopped': the signal that stopped
     training early, 'ended': why training ended early}.
  """
  with console.printing(verbose):
    return Run(config, workdir, mode, checkpoint_path, started=started).run()
