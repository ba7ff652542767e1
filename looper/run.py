"""The outer loop: when to train, evaluate, checkpoint and write summaries.

Synopsis (what `python -m looper.main` does, usable from a notebook)::

    from looper import config as lc, run
    config = my_experiment.get_config()
    result = run.run(config, workdir="/tmp/exp", mode="train_and_eval")
    result["eval"]["accuracy"]

The loop, from the last checkpoint in `workdir` (if any)::

    while step < train.steps:
      n = steps to the next of: steps_per_loop, eval, checkpoint, the end
      losses, logs = trainer.train(iterator, n)     # one tf.function call
      write summaries and a progress line; trainer.on_loop_end(step, logs)
      if step is an eval step or the last: evaluate
      if step is a checkpoint step or the last: save

Clamping each loop to the next boundary makes evaluation and checkpoints
land exactly on their steps, whatever `steps_per_loop` is.
"""

import os
import time

from absl import logging
import ml_collections
import numpy as np
import tensorflow as tf

from looper import checkpoint
from looper import config as config_lib
from looper import distribute
from looper import summaries

MODES = ("train", "eval", "train_and_eval")


def loop_length(step: int, total: int, steps_per_loop: int,
                *every: int) -> int:
  """Steps until the next boundary: a loop's end, an `every` multiple, total."""
  n = min(steps_per_loop, total - step)
  for interval in every:
    if interval:
      n = min(n, interval - step % interval)
  return n


def run(config: ml_collections.ConfigDict, workdir: str,
        mode: str = "train_and_eval") -> dict:
  """Runs an experiment in `workdir`, resuming from its last checkpoint.

  Args:
    config: an experiment config (from `looper.config.default_config()`).
    workdir: where checkpoints, events and config.json go.
    mode: 'train', 'eval' (the latest checkpoint, once) or 'train_and_eval'.

  Returns:
    {'step': the final step, 'train': the last loop's logs (if trained),
     'eval': the last evaluation's logs (if evaluated)}.
  """
  if mode not in MODES:
    raise config_lib.ConfigError(
        f"mode={mode!r} is not one of {', '.join(MODES)}; set --mode")
  config_lib.validate(config)
  strategy = distribute.strategy_for(config)
  trainer_cls = config_lib.resolve(config.trainer, "trainer")
  trainer = trainer_cls(config, strategy)
  chief = distribute.is_chief(strategy)
  ckpt = checkpoint.Checkpointer(
      os.path.join(workdir, "checkpoints"), trainer.checkpoint_items(),
      keep=config.checkpoint.keep, chief=chief,
      task_id=distribute.task_id(strategy))
  out = summaries.Summaries(workdir, chief=chief,
                            total_steps=config.train.steps)
  config_json = config_lib.to_json(config)
  if chief:
    tf.io.gfile.makedirs(workdir)
    with tf.io.gfile.GFile(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config_json)
  restored = ckpt.restore()
  try:
    if mode == "eval":
      if not restored:
        raise config_lib.ConfigError(
            f"--mode=eval found no checkpoint in {ckpt.directory}; train"
            " first, or point --workdir at a trained run")
      step = int(trainer.step.numpy())
      logs = trainer.evaluate()
      out.eval(step, logs)
      return {"step": step, "eval": logs}
    if not restored:
      out.text("config", config_json)
    return _train(trainer, ckpt, out, config,
                  evaluate=mode == "train_and_eval")
  finally:
    out.close()


def _train(trainer, ckpt: checkpoint.Checkpointer, out: summaries.Summaries,
           config: ml_collections.ConfigDict, evaluate: bool) -> dict:
  total, batch = config.train.steps, config.train.batch_size
  eval_every = config.eval.every_steps if evaluate else 0
  ckpt_every = config.checkpoint.every_steps
  step = int(trainer.step.numpy())
  result = {"step": step}
  if step >= total:
    logging.info("Already at step %d of train.steps=%d; nothing to train.",
                 step, total)
    return result
  iterator = iter(trainer.train_data(position=int(trainer.position.numpy())))
  while step < total:
    n = loop_length(step, total, config.train.steps_per_loop, eval_every,
                    ckpt_every)
    start = time.perf_counter()
    losses, logs = trainer.train(iterator, n)
    seconds = time.perf_counter() - start
    _check_finite(losses, step + 1, ckpt)
    logs = dict(loss=float(np.mean(losses)), **logs,
                learning_rate=trainer.learning_rate(),
                steps_per_sec=n / seconds, examples_per_sec=n * batch / seconds)
    out.train(step + 1, losses, logs)
    step += n
    result.update(step=step, train=logs)
    trainer.on_loop_end(step, logs)
    if evaluate and (step == total or (eval_every and step % eval_every == 0)):
      result["eval"] = trainer.evaluate()
      out.eval(step, result["eval"])
    if step == total or (ckpt_every and step % ckpt_every == 0):
      ckpt.save(step)
  return result


def _check_finite(losses: np.ndarray, first_step: int,
                  ckpt: checkpoint.Checkpointer):
  """Stops before a NaN/inf state can be saved over a good checkpoint."""
  bad = np.flatnonzero(~np.isfinite(losses))
  if bad.size:
    latest = ckpt.latest()
    kept = f"{latest} is kept" if latest else "no checkpoint was written"
    raise FloatingPointError(
        f"train loss is {losses[bad[0]]} at step {first_step + bad[0]};"
        f" {kept}; lower --config.optimizer.learning_rate or check the data")
