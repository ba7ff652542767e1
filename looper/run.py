"""Assembles a run from a config: strategy, Trainer, actions, Controller.

Synopsis (what `python -m looper.main` does, usable from a notebook)::

    from looper import run
    config = my_experiment.get_config()
    result = run.run(config, workdir="/tmp/exp", mode="train_and_eval")
    result["eval"]["accuracy"]
    # It prints what the command line prints (verbose=False: nothing).

Modes (the table MODES; each runs a `Controller` method):
  train            train from the last checkpoint in `workdir` (if any)
  train_and_eval   the same, evaluating every `eval.every_steps` and at the end
  eval             evaluate the latest checkpoint (or `checkpoint=PATH`) once
  continuous_eval  beside a training process: evaluate each new checkpoint
                   once, into `workdir/eval_continuous/`
  export           write the latest checkpoint (or `checkpoint=PATH`) as a
                   SavedModel for serving, to `workdir/export/<step>/`
(Every path in `workdir` is named by looper.workdir.Workdir.)

The actions, in the order they run after a loop: train summaries, the
progress line and `Trainer.on_loop_end` (every loop); evaluation with the
best checkpoint and early stop (train_and_eval); the checkpoint save
(`checkpoint.every_steps`, `checkpoint.every_secs`, at the end and on a
stop signal); the export for serving (`export.at_end`). A signal
(looper.train.signals) or, on a Google Cloud VM, a preemption or
maintenance notice (looper.train.vm_notices) asks the trainer's `stop` to stop.
"""

import dataclasses
import time
from typing import Callable

from absl import logging
import ml_collections
import tensorflow as tf

from looper import config as config_lib
from looper import console
from looper import errors
from looper import references
from looper import workdir as workdir_lib
from looper.data import input as input_lib
from looper.train import actions
from looper.train import controller as controller_lib
from looper.options import distribute
from looper.train import dry_run
from looper.train import epochs
from looper.options import best
from looper.train import eval_action
from looper.train import evaluator as evaluator_lib
from looper.train import goodput
from looper.train import vm_notices
from looper.train import peak_flops
from looper.options import precision
from looper.train import signals
from looper.train import profiler
from looper.workdir import checkpoint
from looper.workdir import contents
from looper.workdir import export
from looper.workdir import files
from looper.workdir import hparams
from looper.workdir import lease
from looper.workdir import summaries


@dataclasses.dataclass(frozen=True)
class Mode:
  """What a mode reads and writes."""
  trains: bool  # resumes from the workdir's latest checkpoint and trains
  reads_eval_split: bool  # evaluates, or exports (the eval split's spec)
  takes_checkpoint: bool  # reads --checkpoint=PATH
  # Where its eval events go, of the workdir's; None: it writes none.
  eval_events: Callable[[workdir_lib.Workdir], str] | None


MODES = {
    "train": Mode(trains=True, reads_eval_split=False,
                  takes_checkpoint=False, eval_events=None),
    "eval": Mode(trains=False, reads_eval_split=True, takes_checkpoint=True,
                 eval_events=lambda wd: wd.eval_events),
    "train_and_eval": Mode(trains=True, reads_eval_split=True,
                           takes_checkpoint=False,
                           eval_events=lambda wd: wd.eval_events),
    "continuous_eval": Mode(trains=False, reads_eval_split=True,
                            takes_checkpoint=False,
                            eval_events=lambda wd: wd.continuous_eval_events),
    "export": Mode(trains=False, reads_eval_split=True,
                   takes_checkpoint=True, eval_events=None),
}


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
      start-up is counted from there (looper.train.goodput).
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
    return _run(config, workdir, mode, checkpoint_path, started=started)


def _run(config, workdir: str, mode: str, checkpoint_path: str | None, *,
         started: float | None) -> dict:
  """`run`'s work, its lines shown (console.printing)."""
  if mode not in MODES:
    raise errors.ConfigError(
        f"mode={mode!r} is not one of {', '.join(MODES)}; set --mode")
  if checkpoint_path and not MODES[mode].takes_checkpoint:
    raise errors.ConfigError(
        f"--checkpoint={checkpoint_path} is only read by --mode=eval and"
        " --mode=export; to start training from it set"
        " --config.init.checkpoint instead")
  started = time.monotonic() if started is None else started
  config_lib.validate(config)
  # Process-wide settings the kernels read: before anything runs an op.
  precision.set_deterministic(config.train.deterministic)
  strategy = distribute.strategy_for(config)
  data = input_lib.Input(config, strategy)
  training = MODES[mode].trains
  # Epochs as steps, before anything reads a step (looper.train.epochs); a
  # run that does not train reads the train split only if epochs need it.
  config, epoch = epochs.resolve(config, data, known=training)
  trainer = references.resolve(config.trainer, "trainer")(config, strategy, data)
  evaluator = evaluator_lib.Evaluator(trainer, data)
  # The one task that writes files (summaries, config, checkpoints):
  # TensorFlow's chief rule (the chief task, else worker 0).
  chief = strategy.extended.should_checkpoint
  # Everything that can be checked is checked before a file is written:
  # nothing already saved in `workdir` is touched by a bad config, and a
  # bad eval split fails now, not after hours of training.
  if training:
    dry_run.check_inputs(trainer, data, config.data.train_split)
  if MODES[mode].reads_eval_split:
    dry_run.check_inputs(trainer, data, config.data.eval_split)
  best.check_best_metric(config.checkpoint.best_metric,
                               evaluator.metric_names)
  cores = distribute.tpu_cores(strategy, config.distribution)
  if cores and training:
    warning = distribute.tpu_batch_warning(config.train.batch_size, cores)
    if warning:
      logging.warning("%s", warning)
  # Before a file is written: one writing run per workdir (looper.workdir.lease);
  # readers and the other workers of a multi-worker run do not take it.
  wd = workdir_lib.Workdir(workdir)
  with lease.holding(wd, config.checkpoint.lease_secs,
                     take=chief and training) as held:
    return _run_in_workdir(config, wd, mode, checkpoint_path, strategy,
                           trainer, evaluator, started=started,
                           chief=chief, epoch=epoch,
                           guard=held.check if held else None)


def _run_in_workdir(config, wd: workdir_lib.Workdir, mode: str,
                    checkpoint_path: str | None, strategy, trainer,
                    evaluator, *, started: float, chief: bool,
                    epoch: epochs.Epoch | None, guard) -> dict:
  """`run` once every check passed (and the lease is held, if training)."""
  c = config.checkpoint
  training = MODES[mode].trains
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  ckpt = checkpoint.Checkpointer(
      wd, trainer.checkpoint_items(), keep=c.keep, chief=chief,
      task_id=distribute.task_id(strategy), async_save=c.async_save,
      on_tpu=on_tpu, guard=guard)
  restored = ckpt.restore() if training else None
  if training and not restored and config.init.checkpoint:
    items = {"model": trainer.model}
    if config.init.optimizer:
      items["optimizer"] = trainer.optimizer
    contents.warm_start(config.init.checkpoint, items)
    trainer.optimizer.iterations.assign(0)  # the schedule starts over
  # What MFU is the share of (a probe, cached, or a known figure); the
  # FLOPs of a step are counted after the first loop (looper.train.flops).
  machine = peak_flops.of_run(config, strategy) if training else None
  # Every worker: under `looper launch` each line says whose it is. A
  # reader of a trained run describes what was trained: its config.json.
  logging.info("%s", console.header(
      config, strategy, wd.root, mode,
      _start(mode, restored, checkpoint_path), trainer.model, peak=machine,
      epoch=epoch, note=trainer.random.note(),
      trained=None if training else files.read_json(wd.config)))
  if mode == "export":
    return _export_checkpoint(trainer, evaluator, ckpt, wd, checkpoint_path,
                              chief=chief, on_tpu=on_tpu)
  out = _open_workdir(wd, config, MODES[mode], chief,
                      eval_names=evaluator.metric_names,
                      input_hint=trainer.input.faster() if training else "")
  ledger = None
  try:
    ctl = controller_lib.Controller(
        trainer, ckpt, total_steps=config.train.steps,
        steps_per_loop=config.train.steps_per_loop,
        nan_recovery_tries=config.train.nan_recovery_tries,
        peak=machine)
    evaluations = _add_actions(
        ctl, config, trainer, evaluator, ckpt, out, wd, chief=chief,
        training=training, on_tpu=on_tpu)
    if mode == "eval":
      return ctl.evaluate(evaluations.evaluate, checkpoint_path)
    if mode == "continuous_eval":
      return ctl.continuous_eval(evaluations.evaluate,
                                 timeout_secs=config.eval.timeout_secs)
    if not restored:
      out.start_run(references.to_json(config),
                    summaries.model_summary(trainer.model))
    ledger = goodput.Ledger(wd, started=started) if chief else None
    if ledger:
      ctl.add_actions(save=[_accounting(ledger, out)])
    with (signals.StopOnSignal(trainer.stop.request),
          vm_notices.WatchNotices(trainer.stop.request)):
      result = ctl.train_and_eval() if mode == "train_and_eval" else ctl.train()
    waited = time.monotonic()
    ckpt.wait()
    if ledger:
      ledger.add("checkpoint", time.monotonic() - waited)
      totals = ledger.close(_how_it_ended(result))
      out.goodput(result["step"], totals.fractions())
      # The attempt's time as its record holds it: `looper runs` adds up
      # the records (its "wall (all attempts)"), so one attempt agrees.
      logging.info("%s", console.summary(
          result, wd, ledger.wall,
          best=evaluations.best, checkpoint=ckpt.latest(),
          export=result.get("export"), goodput=totals.line()))
    return result
  except Exception as e:
    # A background save in flight ends before the process does: what it met
    # (the full disk that stopped the run) is raised here, not lost in a
    # traceback at exit after looper's line.
    ckpt.wait()
    if ledger:
      _close_failed(ledger, e)
    raise
  finally:
    out.close()


def _start(mode: str, restored: str | None,
           checkpoint_path: str | None) -> str:
  """What the header says the mode starts from or reads."""
  if MODES[mode].trains:
    return f"resumed from {restored}" if restored else "fresh start"
  if mode == "continuous_eval":
    return "evaluates each new checkpoint"
  verb = "exports" if mode == "export" else "evaluates"
  return f"{verb} {checkpoint_path or 'the latest checkpoint'}"


def _accounting(ledger: goodput.Ledger, out: summaries.Summaries
                ) -> actions.Action:
  """The last action after each loop: the loop's and the actions' time to
  the goodput ledger, its totals to TensorBoard when it writes them."""

  def account(now: actions.Moment) -> None:
    loop = now.loop
    ledger.loop(loop.first_step, len(loop.losses), loop.seconds,
                loop.logs.get("input_wait_fraction", 0.0))
    for name, seconds in now.spent.items():
      ledger.add(name, seconds)
    # The last record is close()'s, after the final save's wait.
    totals = None if now.end or now.stopping else ledger.write()
    if totals:
      out.goodput(now.step, totals.fractions())

  return actions.Action(account, every_loop=True,
                        on_start=lambda now: ledger.start(now.step),
                        name="goodput")


def _how_it_ended(result: dict) -> str:
  if result.get("stopped"):
    return f"stopped by {result['stopped']}"
  if result.get("ended"):
    return f"ended early: {result['ended']}"
  return "finished"


def _close_failed(ledger: goodput.Ledger, error: Exception) -> None:
  """The failed attempt's last record, if the storage takes it: the error
  that ended the run is the one shown."""
  try:
    ledger.close(f"failed: {type(error).__name__}")
  except (tf.errors.OpError, OSError, errors.WorkdirError) as e:
    logging.warning("Could not write the goodput record: %s",
                    errors.first_line(e))


def _export_checkpoint(trainer, evaluator, ckpt: checkpoint.Checkpointer,
                       wd: workdir_lib.Workdir, path: str | None, *,
                       chief: bool, on_tpu: bool) -> dict:
  """--mode=export: restores `path` (default: the latest) and exports it."""
  restored = ckpt.restore(path)
  if not restored:
    raise errors.CheckpointError(
        f"--mode=export found no checkpoint in {ckpt.directory}; train"
        " first, or point --workdir at a trained run")
  result = {"step": trainer.global_step, "checkpoint": restored}
  if chief:  # the other workers hold the same weights
    result["export"] = export.export(trainer, evaluator, wd, on_tpu=on_tpu)
  return result


def _open_workdir(wd: workdir_lib.Workdir, config, mode: Mode, chief: bool,
                  *, eval_names: list[str],
                  input_hint: str) -> summaries.Summaries:
  """config.json (training only) and the event writers, or one line."""
  table = hparams.Table.of(references.to_json(config),
                           references.to_json(config_lib.default_config()),
                           ["loss", *eval_names])
  try:
    if chief and mode.trains:
      with files.on_full_disk(wd.root, "config.json", wd.checkpoints):
        files.makedirs(wd.root)
        files.write_text(wd.config, references.to_json(config))
    return summaries.Summaries(
        wd, chief=chief, total_steps=config.train.steps, trains=mode.trains,
        eval_dir=mode.eval_events(wd) if mode.eval_events else None,
        table=table, input_hint=input_hint)
  except (tf.errors.OpError, OSError) as e:
    raise errors.unwritable_workdir(wd.root, e) from None


def _add_actions(ctl: controller_lib.Controller, config, trainer, evaluator,
                 ckpt: checkpoint.Checkpointer, out: summaries.Summaries,
                 wd: workdir_lib.Workdir, *, chief: bool, training: bool,
                 on_tpu: bool) -> eval_action.EvalAction:
  """Gives `ctl` the actions the config asks for; returns the evaluation
  action (its best evaluation; also what --mode=eval runs).

  The best checkpoint and early stop belong to training: an evaluator
  (--mode=eval, continuous_eval) never touches them.
  """
  c = config.checkpoint
  evaluations = eval_action.EvalAction(
      evaluator, out, checkpointer=ckpt,
      history=files.JsonFile(wd.best_history, wd.checkpoints),
      best=(best.Best(c.best_metric, c.best_mode)
            if training and c.best_metric else None),
      patience=config.train.early_stop_patience if training else 0,
      chief=chief)
  report = [
      # On a (re)start: a killed run may have written events past `step`.
      actions.Action(lambda now: out.train(now.loop.first_step,
                                           now.loop.losses, now.loop.logs),
                     every_loop=True,
                     on_start=lambda now: out.purge_after(now.step),
                     name="train_summaries"),
      actions.Action(lambda now: out.progress(now.step, now.loop.logs),
                     every_loop=True, name="progress"),
      actions.Action(lambda now: trainer.on_loop_end(now.step, now.loop.logs),
                     every_loop=True, name="on_loop_end"),
  ]
  # On a (re)start the evaluator forgets evaluations past `step`; its logs
  # are the mode's result["eval"].
  evaluate = [actions.Action(evaluations, every_steps=config.eval.every_steps,
                             at_end=True, on_start=evaluations.resume,
                             name="eval")]

  def save_checkpoint(now: actions.Moment) -> None:
    # A stop (preemption) saves synchronously: the process exits next.
    ckpt.save(now.step, sync=now.stopping)

  save = [actions.Action(save_checkpoint, every_steps=c.every_steps,
                         every_secs=c.every_secs, at_end=True, on_stop=True,
                         name="checkpoint")]
  if config.profile.start_step:
    save.append(profiler.Window(wd if chief else None,
                                start_step=config.profile.start_step,
                                num_steps=config.profile.num_steps))
  if config.export.at_end and chief:
    # Its path is the mode's result["export"].
    save.append(actions.Action(
        lambda now: export.export(trainer, evaluator, wd, on_tpu=on_tpu),
        at_end=True, name="export"))
  ctl.add_actions(report=report, evaluate=evaluate, save=save)
  return evaluations
