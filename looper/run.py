"""Assembles a run from a config: strategy, Trainer, actions, Controller.

Synopsis (what `python -m looper.main` does, usable from a notebook)::

    from looper import run
    config = my_experiment.get_config()
    result = run.run(config, workdir="/tmp/exp", mode="train_and_eval")
    result["eval"]["accuracy"]

Modes (each a `Controller` method):
  train            train from the last checkpoint in `workdir` (if any)
  train_and_eval   the same, evaluating every `eval.every_steps` and at the end
  eval             evaluate the latest checkpoint (or `checkpoint=PATH`) once
  continuous_eval  beside a training process: evaluate each new checkpoint
                   once, into `workdir/eval_continuous/`
  export           write the latest checkpoint (or `checkpoint=PATH`) as a
                   SavedModel for serving, to `workdir/export/<step>/`

The actions, in the order they run after a loop: train summaries, the
progress line and `Trainer.on_loop_end` (every loop); evaluation with the
best checkpoint and early stop (train_and_eval); the checkpoint save
(`checkpoint.every_steps`, `checkpoint.every_secs`, at the end and on a
stop signal); the export for serving (`export.at_end`).
"""

import os
import time

from absl import logging
import ml_collections
import tensorflow as tf

from looper import actions
from looper import checkpoint
from looper import config as config_lib
from looper import console
from looper import controller as controller_lib
from looper import distribute
from looper import evaluation
from looper import export
from looper import preemption
from looper import profiler
from looper import summaries

MODES = ("train", "eval", "train_and_eval", "continuous_eval", "export")
CONTINUOUS_EVAL_DIR = "eval_continuous"


def run(config: ml_collections.ConfigDict, workdir: str,
        mode: str = "train_and_eval", checkpoint_path: str | None = None
        ) -> dict:
  """Runs an experiment in `workdir`, resuming from its last checkpoint.

  Args:
    config: an experiment config (from `looper.config.default_config()`).
    workdir: where checkpoints, events and config.json go.
    mode: one of MODES (see module doc).
    checkpoint_path: for mode 'eval', a checkpoint prefix to evaluate
      instead of the latest.

  Returns:
    {'step': the final step, 'train': the last loop's logs (if trained),
     'eval': the last evaluation's logs (if evaluated), 'stopped': the
     signal that stopped training early, 'ended': why training ended early}.
  """
  if mode not in MODES:
    raise config_lib.ConfigError(
        f"mode={mode!r} is not one of {', '.join(MODES)}; set --mode")
  if checkpoint_path and mode not in ("eval", "export"):
    raise config_lib.ConfigError(
        f"--checkpoint={checkpoint_path} is only read by --mode=eval and"
        " --mode=export; to start training from it set"
        " --config.init.checkpoint instead")
  started = time.monotonic()
  config_lib.validate(config)
  strategy = distribute.strategy_for(config)
  trainer_cls = config_lib.resolve(config.trainer, "trainer")
  trainer = trainer_cls(config, strategy)
  chief = distribute.is_chief(strategy)
  training = mode in ("train", "train_and_eval")
  # Everything that can be checked is checked before a file is written:
  # nothing already saved in `workdir` is touched by a bad config, and a
  # bad eval split fails now, not after hours of training.
  if training:
    trainer.check_inputs(config.data.train_split)
  if mode != "train":
    trainer.check_inputs(config.data.eval_split)
  evaluation.check_best_metric(config.checkpoint.best_metric, trainer)
  cores = distribute.tpu_cores(strategy, config.distribution)
  if cores and training:
    warning = distribute.tpu_batch_warning(config.train.batch_size, cores)
    if warning:
      logging.warning("%s", warning)
  c = config.checkpoint
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  ckpt = checkpoint.Checkpointer(
      os.path.join(workdir, "checkpoints"), trainer.checkpoint_items(),
      keep=c.keep, chief=chief, task_id=distribute.task_id(strategy),
      async_save=c.async_save, on_tpu=on_tpu)
  if mode == "export":
    return _export_checkpoint(trainer, ckpt, workdir, checkpoint_path,
                              chief=chief, on_tpu=on_tpu)
  restored = ckpt.restore() if training else None
  if training and not restored and config.init.checkpoint:
    items = {"model": trainer.model}
    if config.init.optimizer:
      items["optimizer"] = trainer.optimizer
    checkpoint.warm_start(config.init.checkpoint, items)
    trainer.optimizer.iterations.assign(0)  # the schedule starts over
  # Every worker: under `looper launch` each line says whose it is.
  logging.info("%s", console.header(config, strategy, workdir, mode, restored,
                                    trainer.model))
  out = _open_workdir(workdir, config, mode, chief)
  exported = []  # export.at_end's folder

  def export_now():
    exported.append(export.export(trainer, workdir, on_tpu=on_tpu))

  try:
    ctl, evaluator = _controller(config, trainer, ckpt, out, chief, training,
                                 export_now)
    if mode == "eval":
      return ctl.evaluate(checkpoint_path)
    if mode == "continuous_eval":
      return ctl.continuous_eval(timeout_secs=config.eval.timeout_secs)
    if not restored:
      out.start_run(config_lib.to_json(config),
                    summaries.model_summary(trainer.model))
    with preemption.StopOnSignal(ctl.request_stop):
      result = ctl.train_and_eval() if mode == "train_and_eval" else ctl.train()
    ckpt.wait()
    if evaluator.last is not None:
      result["eval"] = evaluator.last
    if exported:
      result["export"] = exported[-1]
    if chief:
      logging.info("%s", console.summary(
          result, workdir, time.monotonic() - started, best=evaluator.best,
          checkpoint=ckpt.latest(), export=result.get("export")))
    return result
  finally:
    out.close()


def _export_checkpoint(trainer, ckpt: checkpoint.Checkpointer, workdir: str,
                       path: str | None, *, chief: bool, on_tpu: bool
                       ) -> dict:
  """--mode=export: restores `path` (default: the latest) and exports it."""
  restored = ckpt.restore(path)
  if not restored:
    raise checkpoint.CheckpointError(
        f"--mode=export found no checkpoint in {ckpt.directory}; train"
        " first, or point --workdir at a trained run")
  result = {"step": trainer.global_step, "checkpoint": restored}
  if chief:  # the other workers hold the same weights
    result["export"] = export.export(trainer, workdir, on_tpu=on_tpu)
  return result


def _open_workdir(workdir: str, config, mode: str, chief: bool
                  ) -> summaries.Summaries:
  """config.json (training only) and the event writers, or one line."""
  training = mode in ("train", "train_and_eval")
  try:
    if chief and training:
      tf.io.gfile.makedirs(workdir)
      with tf.io.gfile.GFile(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config_lib.to_json(config))
    return summaries.Summaries(
        workdir, chief=chief, total_steps=config.train.steps,
        train_dir="train" if training else None,
        eval_dir={"train": None, "continuous_eval": CONTINUOUS_EVAL_DIR}.get(
            mode, "eval"))
  except (tf.errors.OpError, OSError) as e:
    raise config_lib.ConfigError(
        f"--workdir={workdir} is not a writable directory"
        f" ({config_lib.first_line(e)}); choose another --workdir") from None


def _controller(config, trainer, ckpt: checkpoint.Checkpointer,
                out: summaries.Summaries, chief: bool, training: bool,
                export_fn):
  """The Controller with the actions the config asks for, and its evaluator.

  The best checkpoint and early stop belong to training: an evaluator
  (--mode=eval, continuous_eval) never touches them.
  """
  ctl = None  # the actions below call into it once it exists
  evaluator = evaluation.Evaluator(
      trainer, out, checkpointer=ckpt,
      end_training=lambda reason: ctl.end_training(reason),
      best_metric=config.checkpoint.best_metric if training else "",
      best_mode=config.checkpoint.best_mode,
      patience=config.train.early_stop_patience if training else 0,
      chief=chief)

  def on_resume(step):
    out.purge_after(step)  # a killed run may have written past `step`
    evaluator.resume(step)

  report = [
      actions.Action(lambda step, loop: out.train(loop.first_step,
                                                  loop.losses, loop.logs),
                     every_loop=True, name="train_summaries"),
      actions.Action(lambda step, loop: out.progress(step, loop.logs),
                     every_loop=True, name="progress"),
      actions.Action(lambda step, loop: trainer.on_loop_end(step, loop.logs),
                     every_loop=True, name="on_loop_end"),
  ]
  evaluate = [actions.Action(evaluator, every_steps=config.eval.every_steps,
                             at_end=True, name="evaluate")]
  save = [actions.Action(
      # A stop (preemption) saves synchronously: the process exits next.
      lambda step, loop: ckpt.save(step, sync=ctl.stopping),
      every_steps=config.checkpoint.every_steps,
      every_secs=config.checkpoint.every_secs, at_end=True, on_stop=True,
      name="checkpoint")]
  if config.profile.start_step:
    save.append(profiler.Window(out.train_dir,
                                start_step=config.profile.start_step,
                                num_steps=config.profile.num_steps))
  if config.export.at_end and chief:
    save.append(actions.Action(lambda step, loop: export_fn(), at_end=True,
                               name="export"))
  ctl = controller_lib.Controller(
      trainer, ckpt, total_steps=config.train.steps,
      steps_per_loop=config.train.steps_per_loop, report_actions=report,
      eval_actions=evaluate, save_actions=save, evaluate=evaluator,
      on_resume=on_resume,
      nan_recovery_tries=config.train.nan_recovery_tries)
  return ctl, evaluator
