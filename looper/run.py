"""Assembles a run from a config and runs a mode: `Run`, `run`.

Synopsis (what `python -m looper.main` does, usable from a notebook)::

    from looper import run
    config = my_experiment.get_config()
    result = run.run(config, workdir="/tmp/exp", mode="train_and_eval")
    result["eval"]["accuracy"]
    # It prints what the command line prints (verbose=False: nothing).

    class MyRun(run.Run):              # one piece changed, the rest as is
      def _build_checkpointer(self, guard): ...
    MyRun(config, "/tmp/exp", "train").run()

Modes: train, train_and_eval, eval, continuous_eval, export (what each
reads and writes: looper.modes.MODES; every path in `workdir` is named by
looper.workdir.Workdir).

A `Run` builds each piece once, in this order, each in a method a
subclass may override (as Model Garden's OrbitExperimentRunner); a piece
gets what it needs as arguments, from the pieces built before it:

  _build_strategy      config.distribution -> tf.distribute.Strategy
  _build_batch         the batch's numbers (looper.data.batch)
  _build_input         the data (looper.data.input.Input); epochs -> steps
  _build_trainer       config.trainer: state, step seams, its train loop
  _build_spikes        train.spike_factor's loss spikes (training, if set)
  _build_evaluator     one exact pass over each eval set
  _build_callbacks     config.callbacks, Keras' (looper.control.callbacks)
  _build_trackers      config.trackers: installed, answering (looper.trackers)
      (everything checked; the workdir's lease taken, if training)
  _build_checkpointer  saves and restores (looper.workdir.checkpoint)
  _build_summaries     the writers: events, metrics.jsonl, config.json,
                       the lines, the trackers
  _build_evaluation    evaluation as an action (best checkpoint, early stop)
  _build_controller    the outer loop (looper.control.controller)
  _build_actions       what runs after each loop, by group
                       (looper.control.standard_actions), with the user's
                       (config.actions, looper.control.actions)

A signal (looper.control.signals) or a Google Cloud VM's preemption or
maintenance notice (looper.control.vm_notices) asks the trainer to stop.
"""

import time

from absl import logging
import ml_collections
import tensorflow as tf

from looper import config as config_lib
from looper import console
from looper import errors
from looper import modes
from looper import references
from looper import trackers as trackers_lib
from looper import workdir as workdir_lib
from looper.data import batch as batch_lib
from looper.data import input as input_lib
from looper.data import splits
from looper.modes import MODES
from looper.options import best
from looper.options import distribute
from looper.options import optimizer_state
from looper.options import precision
from looper.control import actions as actions_lib
from looper.control import callbacks
from looper.control import controller as controller_lib
from looper.measure import dry_run
from looper.control import eval_action
from looper.train import evaluator as evaluator_lib
from looper.measure import goodput
from looper.measure import peak_flops
from looper.control import profiler
from looper.control import signals
from looper.control import spikes
from looper.control import standard_actions
from looper.control import vm_notices
from looper.workdir import checkpoint
from looper.workdir import contents
from looper.workdir import files
from looper.workdir import lease
from looper.workdir import summaries


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


class Run:
  """One mode run in one workdir, built piece by piece (see module doc).

  The constructor builds and checks what needs no file (strategy to
  callbacks): a bad config or eval split fails before anything in
  `workdir` is touched. `run()` takes the workdir (its lease, if
  training), builds the rest and runs the mode; call it once.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               mode: str = "train_and_eval",
               checkpoint_path: str | None = None, *,
               started: float | None = None):
    if mode not in MODES:
      raise errors.ConfigError(
          f"mode={mode!r} is not one of {', '.join(MODES)}; set --mode")
    if checkpoint_path and not MODES[mode].takes_checkpoint:
      raise errors.ConfigError(
          f"--checkpoint={checkpoint_path} is only read by --mode=eval and"
          " --mode=export; to start training from it set"
          " --config.init.checkpoint instead")
    self.mode, self.checkpoint_path = mode, checkpoint_path
    self.started = time.monotonic() if started is None else started
    self.trains = MODES[mode].trains
    config_lib.validate(config)
    # Process-wide settings the kernels read: before anything runs an op.
    precision.set_deterministic(config.train.deterministic)
    self.config = config
    self.workdir = workdir_lib.Workdir(workdir)
    self.strategy = self._build_strategy()
    # The one task that writes files (summaries, config, checkpoints):
    # TensorFlow's chief rule (the chief task, else worker 0).
    self.chief = self.strategy.extended.should_checkpoint
    self.batch = self._build_batch()
    self.input = self._build_input()
    # Epochs as steps, before anything reads a step (looper.control.epochs); a
    # run that does not train reads the train split only if epochs need it.
    self.config, self.epoch = config_lib.resolve_epochs(config, self.input,
                                                        known=self.trains)
    # The loop's buffer and the Controller's loops: one value, read once.
    self.steps_per_loop = self.config.train.steps_per_loop
    self.trainer = self._build_trainer()
    self.spikes = self._build_spikes()
    self.evaluator = self._build_evaluator()
    # The user's actions (config.actions), a factory's called once, now:
    # a bad one fails before anything is written.
    self.user_actions = actions_lib.of_config(self.config)
    self.callbacks = self._build_callbacks()
    self.trackers = self._build_trackers()
    self._check()

  # --- The pieces: each built once, overridable -------------------------------

  def _build_strategy(self) -> tf.distribute.Strategy:
    return distribute.strategy_for(self.config.distribution)

  def _build_batch(self) -> batch_lib.Batch:
    c = self.config
    return batch_lib.of(c.train, c.eval, self.strategy.num_replicas_in_sync)

  def _build_input(self) -> input_lib.Input:
    c = self.config  # only its dataset_fn gets it whole
    return input_lib.Input(c.data, self.strategy, self.batch, seed=c.seed,
                           dataset_fn=references.bound(c, "dataset_fn"))

  def _build_trainer(self):
    trainer_cls = references.resolve(self.config.trainer, "trainer")
    return trainer_cls(self.config, self.strategy, self.input, self.batch,
                       steps_per_loop=self.steps_per_loop)

  def _build_spikes(self) -> spikes.SpikeGuard | None:
    """train.spike_factor's check (None: 0, or no training); its recent
    losses join the checkpoint."""
    factor = self.config.train.spike_factor
    return spikes.SpikeGuard(self.strategy, factor) if (
        factor and self.trains) else None

  def _build_evaluator(self) -> evaluator_lib.Evaluator:
    return evaluator_lib.Evaluator(self.trainer, self.input)

  def _build_callbacks(self) -> callbacks.Callbacks:
    """config.callbacks (Keras'), of a run that trains."""
    c = self.config
    return callbacks.build(
        c, c.callbacks if self.trains else (), self.trainer, chief=self.chief,
        every_steps=c.eval.every_steps, total_steps=c.train.steps,
        eval_batch_size=c.eval.batch_size, monitor=splits.monitor_set(c))

  def _build_checkpointer(self, guard) -> checkpoint.Checkpointer:
    """`guard`: the lease's check before each save (None: not held)."""
    c = self.config.checkpoint
    return checkpoint.Checkpointer(
        self.workdir, {**self.trainer.checkpoint_items(),
                       **self.callbacks.checkpoint_items(),
                       **(self.spikes.checkpoint_items() if self.spikes
                          else {})}, keep=c.keep,
        chief=self.chief, task_id=distribute.task_id(self.strategy),
        async_save=c.async_save, on_tpu=self.on_tpu, guard=guard)

  def _build_trackers(self) -> list:
    """config.trackers (looper.trackers), each checked now (installed, its
    server answering): a training run's chief's; [] elsewhere."""
    names = trackers_lib.parse(self.config.trackers)  # a typo: everywhere
    return (trackers_lib.build(self.config.trackers, self.workdir)
            if names and self.trains and self.chief else [])

  def _build_summaries(self) -> summaries.Summaries:
    """The writers (events, metrics.jsonl, lines, trackers), config.json."""
    return modes.open_workdir(
        self.workdir, references.to_json(self.config), MODES[self.mode],
        self.chief, total_steps=self.config.train.steps, trackers=self.trackers,
        eval_names=self.evaluator.metric_names,
        input_hint=self.input.faster() if self.trains else "")

  def _build_evaluation(self) -> eval_action.EvalAction:
    """The evaluations: what --mode=eval runs, and train_and_eval's eval
    action. The best checkpoint and early stop belong to training: an
    evaluator (--mode=eval, continuous_eval) never touches them."""
    c = self.config.checkpoint
    return eval_action.EvalAction(
        self.evaluator, self.summaries, checkpointer=self.checkpointer,
        history=files.JsonFile(self.workdir.best_history,
                               self.workdir.checkpoints),
        best=(best.Best(c.best_metric, c.best_mode)
              if self.trains and c.best_metric else None),
        patience=self.config.train.early_stop_patience if self.trains else 0,
        chief=self.chief)

  def _build_controller(self) -> controller_lib.Controller:
    c = self.config.train
    return controller_lib.Controller(
        self.trainer, self.checkpointer, data=self.input, batch=self.batch,
        total_steps=c.steps, steps_per_loop=self.steps_per_loop,
        nan_recovery_tries=c.nan_recovery_tries, spikes=self.spikes,
        peak=self.peak, writer=self.summaries.writer, chief=self.chief)

  def _build_actions(self) -> dict[str, list]:
    """The Controller's actions by group ({'report', 'evaluate', 'save'}),
    in the order they run after a loop. The user's actions run first in
    'save': after the evaluation, and before the checkpoint that covers
    what they wrote; Keras callbacks around the standard ones (their
    places: looper.control.callbacks); the trackers' deliveries last."""
    c, wd, out = self.config, self.workdir, self.summaries
    calls = self.callbacks.actions(eval_logs=self.evaluation.evaluate,
                                   latest=self.checkpointer.kept)
    report = [standard_actions.train_summaries(out),
              standard_actions.loop_end_hook(self.trainer), *calls.report]
    evaluate = [*calls.before_eval, standard_actions.evaluations(
        self.evaluation, every_steps=c.eval.every_steps), *calls.after_eval]
    save = [*calls.before_save, *self.user_actions,
            standard_actions.checkpoints(
                self.checkpointer, every_steps=c.checkpoint.every_steps,
                every_secs=c.checkpoint.every_secs), *calls.after_save]
    if c.profile.start_step:
      save.append(profiler.Window(wd if self.chief else None,
                                  start_step=c.profile.start_step,
                                  num_steps=c.profile.num_steps))
    if c.export.at_end and self.chief:  # its path: result["export"]
      save.append(standard_actions.export_at_end(
          self.trainer, self.evaluator, wd, on_tpu=self.on_tpu))
    if self.trackers:  # after every save: what it made durable goes out
      save.append(standard_actions.deliveries(self.trackers,
                                              self.checkpointer))
    return {"report": report, "evaluate": evaluate, "save": save}

  # --- Running ----------------------------------------------------------------

  @property
  def on_tpu(self) -> bool:
    return isinstance(self.strategy, tf.distribute.TPUStrategy)

  def _check(self) -> None:
    """Everything that can be checked is checked before a file is written:
    nothing already saved in `workdir` is touched by a bad config, and a
    bad eval split fails now, not after hours of training."""
    c = self.config
    reads = MODES[self.mode].reads(c.data.train_split, self.evaluator.sets)
    dry_run.check_inputs(self.trainer, self.input, reads, loss=c.loss,
                         metrics=c.metrics, data=c.data)
    best.check_best_metric(c.checkpoint.best_metric,
                           self.evaluator.metric_names)
    cores = distribute.tpu_cores(self.strategy, c.distribution)
    for warning in (self.trains and self.input.short_split(c.data.train_split),
                    self.trains and cores and distribute.tpu_batch_warning(
                        self.batch.micro_batch_size, cores)):
      if warning:
        logging.warning("%s", warning)

  def run(self) -> dict:
    """Runs the mode; see `run` for the result. One writing run per
    workdir (looper.workdir.lease): readers and the other workers of a
    multi-worker run do not take it."""
    with lease.holding(self.workdir, self.config.checkpoint.lease_secs,
                       take=self.chief and self.trains) as held:
      self.checkpointer = self._build_checkpointer(
          held.check if held else None)
      return self._run_mode()

  def _run_mode(self) -> dict:
    """The mode, once every check passed (and the lease is held)."""
    config, wd, mode = self.config, self.workdir, self.mode
    trainer, ckpt = self.trainer, self.checkpointer
    restored = self._restore() if self.trains else None
    # What MFU is the share of (a probe, cached, or a known figure); the
    # FLOPs of a step are counted after the first loop (looper.measure.flops).
    self.peak = (peak_flops.of_run(config.train, self.strategy)
                 if self.trains else None)
    # Every worker: under `looper launch` each line says whose it is.
    shown, differs = modes.described(mode, config, wd)
    logging.info("%s", console.header(
        self.strategy, wd.root, mode, modes.start(
            mode, restored, self.checkpoint_path), trainer.model, self.batch,
        shown.train, shown.eval, shown.checkpoint, shown.distribution,
        peak=self.peak, epoch=self.epoch, differs=differs,
        note=trainer.random.note(), state=optimizer_state.per_device(
            self.strategy, trainer.update, trainer.ema)))
    if mode == "export":
      return modes.export_checkpoint(trainer, self.evaluator, ckpt, wd,
                                     self.checkpoint_path, chief=self.chief,
                                     on_tpu=self.on_tpu)
    self.summaries = out = self._build_summaries()
    ledger = None
    try:
      trackers_lib.open_runs(self.trackers, references.to_json(config))
      self.evaluation = self._build_evaluation()
      self.controller = ctl = self._build_controller()
      ctl.add_actions(**self._build_actions())
      if mode == "eval":
        return ctl.evaluate(self.evaluation.evaluate, self.checkpoint_path)
      if mode == "continuous_eval":
        return ctl.continuous_eval(self.evaluation.evaluate,
                                   timeout_secs=config.eval.timeout_secs)
      if not restored:
        out.start_run(references.to_json(config),
                      summaries.model_summary(trainer.model))
      ledger = goodput.Ledger(wd, started=self.started) if self.chief else None
      if ledger:  # the last action: it times the others
        ctl.add_actions(save=[standard_actions.accounting(ledger, out)])
      with (signals.StopOnSignal(trainer.stop.request),
            vm_notices.WatchNotices(trainer.stop.request)):
        result = (ctl.train_and_eval() if mode == "train_and_eval"
                  else ctl.train())
      waited = time.monotonic()
      ckpt.wait()
      if ledger:
        ledger.add("checkpoint", time.monotonic() - waited)
        totals = ledger.close(goodput.how_it_ended(result))
        out.goodput(result["step"], totals.fractions())
        closed = trackers_lib.close_runs(
            self.trackers, ckpt.durable_step, stopped=result.get("stopped"),
            figures=out.figures)
        # The attempt's time as its record holds it: `looper runs` adds up
        # the records (its "wall (all attempts)"), so one attempt agrees.
        logging.info("%s", console.summary(
            result, wd, ledger.wall,
            best=self.evaluation.best, checkpoint=ckpt.latest(),
            export=result.get("export"), goodput=totals.line(),
            trackers=closed))
      return result
    except Exception as e:
      # A background save in flight ends before the process does: what it
      # met (the full disk that stopped the run) is raised here, not lost in
      # a traceback at exit after looper's line.
      ckpt.wait()
      if ledger:
        ledger.close_failed(e)
      trackers_lib.close_runs(self.trackers, ckpt.durable_step, failed=True)
      raise
    finally:
      out.close()

  def _restore(self) -> str | None:
    """The workdir's latest checkpoint, restored (its path), or else the
    warm start config.init names (the schedule starts over); None."""
    restored = self.checkpointer.restore()
    init = self.config.init
    if not restored and init.checkpoint:
      items = {"model": self.trainer.model}
      if init.optimizer:  # as a checkpoint holds it (whole if sharded)
        items["optimizer"] = self.trainer.checkpoint_items()["optimizer"]
      contents.warm_start(init.checkpoint, items)
      self.trainer.optimizer.iterations.assign(0)
    return restored
