"""The `Run`: each piece of a run built once, in order, then the mode.

Synopsis (what `looper.run.run` does; a subclass changes one piece)::

    class MyRun(run.Run):              # the rest as is
      def _build_checkpointer(self, guard): ...
    MyRun(config, "/tmp/exp", "train").run()

    trainer = run.Run(config, "/tmp/exp").trainer   # nothing written

A `Run` builds each piece once, in this order, each in a method a
subclass may override (as Model Garden's OrbitExperimentRunner); a piece
gets what it needs as arguments, or reads the pieces built before it.
The constructor builds what needs no file, then checks everything:

  _build_strategy      config.distribution -> tf.distribute.Strategy
  _build_batch         the batch's numbers (looper.data.batch)
  _build_input         the data (looper.data.input.Input)
      (epochs as steps: looper.config.resolve_epochs; the stop request)
  _build_watchers      what asks to stop: signals, a GCE VM's notices
  _build_trainer       config.trainer, the options around its step
                       (looper.run.pieces, looper.train.step_options)
  _build_spikes        train.spike_factor's loss spikes (training, if set)
  _build_evaluator     each eval set's exact pass, from the eval step
      (the user's actions: config.actions, looper.control.actions)
  _build_callbacks     config.callbacks, Keras' (looper.control.callbacks)
  _build_trackers      config.trackers: installed, answering (looper.trackers)
      (everything checked: looper.run.pieces.check)

`run()` takes the workdir's lease (if training) and builds the rest:

  _build_checkpointer  saves and restores (looper.workdir.checkpoint)
      (the last checkpoint restored, if training)
  _build_peak          the FLOP/s MFU is the share of (training)
      (the header; --mode=export exports: looper.modes)
  _build_summaries     the writers: events, metrics.jsonl, config.json,
                       the lines, the trackers
  _build_ledger        the goodput ledger (the chief's, training)
  _build_attempt       around the mode: the trackers' runs, the watchers,
                       the closing records (looper.run.attempt)
  _build_evaluation    evaluation as an action (best checkpoint, early stop)
  _build_controller    the outer loop (looper.control.controller)
  _build_actions       what runs after each loop, by group
                       (looper.control.standard_actions), with the user's
      (the mode, through the Controller: looper.run.attempt)
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
from looper.options import cluster
from looper.options import distribute
from looper.options import optimizer_state
from looper.options import precision
from looper.control import actions as actions_lib
from looper.control import callbacks
from looper.control import controller as controller_lib
from looper.control import eval_action
from looper.train import evaluator as evaluator_lib
from looper.train import stopping
from looper.train import trainer as trainer_lib
from looper.measure import goodput
from looper.measure import peak_flops
from looper.control import profiler
from looper.control import signals
from looper.control import spikes
from looper.control import standard_actions
from looper.control import vm_notices
from looper.workdir import checkpoint
from looper.workdir import files
from looper.workdir import lease
from looper.workdir import summaries
from looper.run import attempt as attempt_lib
from looper.run import pieces


class Run:
  """One mode run in one workdir, built piece by piece (see module doc).

  The constructor builds and checks what needs no file (strategy to
  trackers): a bad config or eval split fails before anything in
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
    # The stop request: the watchers make it, the train loop reads it
    # before each step, the Controller after each loop.
    self.stop = stopping.StopFlag(self.strategy)
    self.watchers = self._build_watchers(self.stop)
    self.trainer = self._build_trainer(self.stop)
    self.spikes = self._build_spikes()
    self.evaluator = self._build_evaluator(self.trainer)
    # The user's actions (config.actions), a factory's called once, now:
    # a bad one fails before anything is written.
    self.user_actions = actions_lib.of_config(self.config)
    self.callbacks = self._build_callbacks(self.trainer)
    self.trackers = self._build_trackers()
    pieces.check(self.config, self.trainer, self.input, self.evaluator,
                 MODES[mode])

  def run(self) -> dict:
    """Runs the mode; see `run` for the result. One writing run per
    workdir (looper.workdir.lease): readers and the other workers of a
    multi-worker run do not take it."""
    with lease.holding(self.workdir, self.config.checkpoint.lease_secs,
                       take=self.chief and self.trains) as held:
      self.checkpointer = self._build_checkpointer(
          held.check if held else None)
      restored = (pieces.restore(self.config, self.trainer, self.checkpointer)
                  if self.trains else None)
      self.peak = self._build_peak()
      self._say_header(restored)
      if self.mode == "export":
        return modes.export_checkpoint(
            self.checkpointer, self.workdir, self.checkpoint_path,
            model=self.trainer.model, serve=self.trainer.serve,
            step=self.trainer.step, evaluator=self.evaluator,
            chief=self.chief, on_tpu=self.on_tpu)
      self.summaries = self._build_summaries()
      self.ledger = self._build_ledger()
      self.attempt = self._build_attempt(self.checkpointer, self.summaries,
                                         self.ledger)
      with self.attempt.running():
        self.evaluation = self._build_evaluation(self.checkpointer,
                                                 self.summaries)
        self.controller = self._build_controller(
            self.checkpointer, self.summaries, self.peak)
        self.controller.add_actions(**self._build_actions(
            self.evaluation, self.checkpointer, self.summaries, self.ledger))
        return self.attempt.run(
            self.mode, self.controller, self.evaluation,
            checkpoint_path=self.checkpoint_path,
            timeout_secs=self.config.eval.timeout_secs,
            model_text=(summaries.model_summary(self.trainer.model)
                        if self.trains and not restored else None))

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

  def _build_watchers(self, stop: stopping.StopFlag) -> list:
    """Contexts that ask `stop` for a stop while training runs: SIGTERM
    and SIGINT, a Google Cloud VM's preemption or maintenance notice."""
    return [signals.StopOnSignal(stop.request),
            vm_notices.WatchNotices(stop.request)]

  def _build_trainer(self, stop: stopping.StopFlag) -> trainer_lib.Trainer:
    return pieces.trainer(self.config, self.strategy, self.input, self.batch,
                          steps_per_loop=self.steps_per_loop, stop=stop)

  def _build_spikes(self) -> spikes.SpikeGuard | None:
    """train.spike_factor's check (None: 0, or no training); its recent
    losses join the checkpoint."""
    factor = self.config.train.spike_factor
    return spikes.SpikeGuard(self.strategy, factor) if (
        factor and self.trains) else None

  def _build_evaluator(self, trainer) -> evaluator_lib.Evaluator:
    return pieces.evaluator(trainer, self.input)

  def _build_callbacks(self, trainer) -> callbacks.Callbacks:
    """config.callbacks (Keras'), of a run that trains: they get the
    model, the optimizer, the learning-rate scale and the train metrics."""
    c = self.config
    return callbacks.build(
        c, c.callbacks if self.trains else (), model=trainer.model,
        optimizer=trainer.optimizer, rate_scale=trainer.learning_rate_scale,
        metrics=trainer.train_metrics, chief=self.chief,
        every_steps=c.eval.every_steps, total_steps=c.train.steps,
        eval_batch_size=c.eval.batch_size, monitor=splits.monitor_set(c))

  def _build_trackers(self) -> list:
    """config.trackers (looper.trackers), each checked now (installed, its
    server answering): a training run's chief's; [] elsewhere."""
    c = self.config
    names = trackers_lib.check(c.trackers, c.trackers_group)  # everywhere
    return (trackers_lib.build(c.trackers, self.workdir, c.trackers_group)
            if names and self.trains and self.chief else [])

  def _build_checkpointer(self, guard) -> checkpoint.Checkpointer:
    """`guard`: the lease's check before each save (None: not held)."""
    c = self.config.checkpoint
    return checkpoint.Checkpointer(
        self.workdir, {**self.trainer.checkpoint_items(),
                       **self.callbacks.checkpoint_items(),
                       **(self.spikes.checkpoint_items() if self.spikes
                          else {})}, keep=c.keep,
        chief=self.chief, task_id=cluster.task_id(self.strategy),
        async_save=c.async_save, on_tpu=self.on_tpu, guard=guard)

  def _build_peak(self) -> peak_flops.Peak | None:
    """What MFU is the share of (a probe, cached, or a known figure), of a
    run that trains; the FLOPs of a step are counted after the first loop
    (looper.measure.flops)."""
    return (peak_flops.of_run(self.config.train, self.strategy)
            if self.trains else None)

  def _build_summaries(self) -> summaries.Summaries:
    """The writers (events, metrics.jsonl, lines, trackers), config.json."""
    return modes.open_workdir(
        self.workdir, references.to_json(self.config), MODES[self.mode],
        self.chief, total_steps=self.config.train.steps, trackers=self.trackers,
        eval_names=self.evaluator.metric_names,
        input_hint=self.input.faster() if self.trains else "")

  def _build_ledger(self) -> goodput.Ledger | None:
    """The attempt's time, accounted (looper.measure.goodput): the chief's,
    of a run that trains."""
    return (goodput.Ledger(self.workdir, started=self.started)
            if self.chief and self.trains else None)

  def _build_attempt(self, checkpointer, out: summaries.Summaries,
                     ledger: goodput.Ledger | None) -> attempt_lib.Attempt:
    return attempt_lib.Attempt(
        checkpointer, out, self.workdir, trackers=self.trackers,
        config_json=references.to_json(self.config), ledger=ledger,
        watchers=self.watchers)

  def _build_evaluation(self, checkpointer, out: summaries.Summaries
                        ) -> eval_action.EvalAction:
    """The evaluations: what --mode=eval runs, and train_and_eval's eval
    action. The best checkpoint and early stop belong to training: an
    evaluator (--mode=eval, continuous_eval) never touches them."""
    c = self.config.checkpoint
    return eval_action.EvalAction(
        self.evaluator, out, checkpointer=checkpointer,
        history=files.JsonFile(self.workdir.best_history,
                               self.workdir.checkpoints),
        best=(best.Best(c.best_metric, c.best_mode)
              if self.trains and c.best_metric else None),
        patience=self.config.train.early_stop_patience if self.trains else 0,
        chief=self.chief)

  def _build_controller(self, checkpointer, out: summaries.Summaries,
                        peak: peak_flops.Peak | None
                        ) -> controller_lib.Controller:
    c = self.config.train
    return controller_lib.Controller(
        self.trainer, checkpointer, data=self.input, batch=self.batch,
        total_steps=c.steps, steps_per_loop=self.steps_per_loop,
        nan_recovery_tries=c.nan_recovery_tries, spikes=self.spikes,
        peak=peak, writer=out.writer, model=self.trainer.model,
        chief=self.chief)

  def _build_actions(self, evaluation: eval_action.EvalAction, checkpointer,
                     out: summaries.Summaries,
                     ledger: goodput.Ledger | None) -> dict[str, list]:
    """The Controller's actions by group ({'report', 'evaluate', 'save'}),
    in the order they run after a loop. The user's actions run first in
    'save': after the evaluation, and before the checkpoint that covers
    what they wrote; Keras callbacks around the standard ones (their
    places: looper.control.callbacks); the trackers' deliveries, then the
    goodput accounting, which times the others, last."""
    c, wd, t = self.config, self.workdir, self.trainer
    calls = self.callbacks.actions(eval_logs=evaluation.evaluate,
                                   latest=checkpointer.kept)
    report = [standard_actions.train_summaries(out),
              standard_actions.loop_end_hook(t.on_loop_end), *calls.report]
    evaluate = [*calls.before_eval, standard_actions.evaluations(
        evaluation, every_steps=c.eval.every_steps), *calls.after_eval]
    save = [*calls.before_save, *self.user_actions,
            standard_actions.checkpoints(
                checkpointer, every_steps=c.checkpoint.every_steps,
                every_secs=c.checkpoint.every_secs), *calls.after_save]
    if c.profile.start_step:
      save.append(profiler.Window(wd if self.chief else None,
                                  start_step=c.profile.start_step,
                                  num_steps=c.profile.num_steps))
    if c.export.at_end and self.chief:  # its path: result["export"]
      save.append(standard_actions.export_at_end(
          t.model, t.serve, self.evaluator, wd, on_tpu=self.on_tpu))
    if self.trackers:  # after every save: what it made durable goes out
      save.append(standard_actions.deliveries(self.trackers, checkpointer))
    if ledger:
      save.append(standard_actions.accounting(ledger, out))
    return {"report": report, "evaluate": evaluate, "save": save}

  # --- Running ----------------------------------------------------------------

  @property
  def on_tpu(self) -> bool:
    return isinstance(self.strategy, tf.distribute.TPUStrategy)

  def _say_header(self, restored: str | None) -> None:
    """The run's first lines: the chief's header, one line on each other
    worker (`looper launch` prefixes each with whose it is). A reader of
    a trained run describes what was trained (its config.json) and where
    the command line differs."""
    trainer, mode = self.trainer, self.mode
    start = modes.start(mode, restored, self.checkpoint_path)
    # Each worker's, as --verbosity=1 logs what its devices hold.
    state = optimizer_state.per_device(self.strategy, trainer.update,
                                       trainer.ema)
    if not self.chief:  # the same run: the chief's header says it once
      logging.info("looper %s: worker %d in %s (%s); its chief prints the"
                   " run", mode, cluster.task_id(self.strategy),
                   self.workdir.root, start)
      return
    shown, differs = modes.described(mode, self.config, self.workdir)
    logging.info("%s", console.header(
        self.strategy, self.workdir.root, mode, start, trainer.model,
        self.batch, shown.train, shown.eval, shown.checkpoint,
        shown.distribution,
        peak=self.peak, epoch=self.epoch, differs=differs,
        note=trainer.random.note(), state=state))
