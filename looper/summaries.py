"""TensorBoard event files and progress lines; only the chief writes.

Synopsis::

    out = summaries.Summaries(workdir, chief=True, total_steps=1000)
    out.text("config", config_json)
    out.train(first_step=1, losses=per_step_losses, logs={...})  # one loop
    out.eval(step=100, logs={"loss": ..., "accuracy": ..., "examples": ...})
    out.close()

Layout: `workdir/train/` holds the loss of every step and, per loop, each
train metric, `learning_rate`, `steps_per_sec` and `examples_per_sec`;
`workdir/eval/` holds every eval metric and `examples` (how many real
examples were counted). Same tag names in both runs, so TensorBoard draws
train and eval on one chart.
"""

import datetime
import os

from absl import logging
import numpy as np
import tensorflow as tf


def _format(logs: dict[str, float]) -> str:
  return " ".join(f"{k}={v:.4g}" for k, v in logs.items())


class Summaries:
  """Writes train/ and eval/ event files; a no-op writer on non-chiefs."""

  def __init__(self, workdir: str, *, chief: bool, total_steps: int):
    self._chief = chief
    self._total_steps = total_steps
    if chief:
      self._train = tf.summary.create_file_writer(
          os.path.join(workdir, "train"))
      self._eval = tf.summary.create_file_writer(os.path.join(workdir, "eval"))
    else:
      self._train = self._eval = tf.summary.create_noop_writer()

  def text(self, tag: str, text: str, step: int = 0) -> None:
    with self._train.as_default():
      tf.summary.text(tag, f"```\n{text}\n```", step=step)

  def train(self, first_step: int, losses: np.ndarray,
            logs: dict[str, float]) -> None:
    """One loop: the loss of each step from `first_step`, then loop scalars.

    `logs` must hold 'steps_per_sec'; it is logged with the progress line.
    """
    last = first_step + len(losses) - 1
    with self._train.as_default():
      for step, loss in enumerate(losses, start=first_step):
        tf.summary.scalar("loss", loss, step=step)
      for name, value in logs.items():
        if name != "loss":  # the per-step series above is the loss curve
          tf.summary.scalar(name, value, step=last)
    self._train.flush()
    if self._chief:
      eta = (self._total_steps - last) / max(logs["steps_per_sec"], 1e-9)
      logging.info("train step %d/%d: %s | ETA %s", last, self._total_steps,
                   _format(logs), datetime.timedelta(seconds=round(eta)))

  def eval(self, step: int, logs: dict[str, float]) -> None:
    with self._eval.as_default():
      for name, value in logs.items():
        tf.summary.scalar(name, value, step=step)
    self._eval.flush()
    if self._chief:
      logging.info("eval at step %d: %s", step, _format(logs))

  def close(self) -> None:
    self._train.close()
    self._eval.close()
