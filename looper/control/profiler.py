"""A profiler window: a trace of a few train steps, as one action.

Synopsis (what `run.Run._build_actions` adds for `profile.start_step=100`)::

    window = profiler.Window(workdir.Workdir("/tmp/mnist"), start_step=100,
                             num_steps=5)
    controller = Controller(trainer, ..., save_actions=[save, window])
    # steps 101..105 traced into /tmp/mnist/train/plugins/profile/<time>/
    # <host>.xplane.pb (Workdir.profile), shown by TensorBoard's Profile tab
    # once the tensorboard-plugin-profile package is installed (looper's
    # 'profile' extra: pip install -e '.[profile]')

The window is an `actions.Action` whose boundaries are its two edges, so the
Controller ends a loop exactly at `start_step` (the trace starts after it)
and at `start_step + num_steps` (the trace stops), and every step between:
inside the window each loop is ONE step, and the train loop marks each
one-step call as a step (`tf.profiler.experimental.Trace("train",
step_num=...)`, what Keras fit marks), so the Profile tab's Overview shows the time of
each traced step and its input / compute split. It runs after the other
actions, so the trace holds those steps' loops and the actions after them
(train summaries; an evaluation or a save landing on the last step), and
nothing of what ran at `start_step`. A run that ends or stops on a
signal inside the window stops the trace there; a run resumed inside the
window traces the rest of it.

TensorFlow writes the trace itself (`tf.profiler.experimental`), as the
trace stops; a disk that refuses it ends the run in the one line of every
refused write (looper.workdir.files). Only the TensorBoard plugin that
shows it is an optional extra. The `profile` block is declared here
(`config()`).
"""

from typing import Callable

from absl import logging
import ml_collections
import tensorflow as tf

from looper import fields
from looper import workdir as workdir_lib
from looper.control import actions
from looper.workdir import files


class Window(actions.Action):
  """Traces train steps `start_step + 1 .. start_step + num_steps`.

  Args:
    workdir: the trace goes to its `profile` directory; None: this process
      does not trace (a non-chief worker), but its loops still end on the
      window's edges, like every worker's must.
    start_step: the trace starts after this step (>= 1).
    num_steps: how many steps it holds (>= 1).
    start, stop: the profiler's start(logdir) and stop(), injectable so the
      window's timing is testable without TensorFlow.
  """

  def __init__(self, workdir: workdir_lib.Workdir | None, *,
               start_step: int, num_steps: int,
               start: Callable[[str], None] = tf.profiler.experimental.start,
               stop: Callable[[], None] = tf.profiler.experimental.stop):
    if start_step < 1 or num_steps < 1:
      raise ValueError(f"profiler window: start_step={start_step} and"
                       f" num_steps={num_steps} must be >= 1")
    super().__init__(self._update, at_end=True, on_stop=True,
                     all_workers=True, name="profile")
    self._workdir = workdir
    self._edges = (start_step, start_step + num_steps)
    self._start, self._stop = start, stop
    self._finishing = False
    self.tracing = False

  def boundary(self, step: int) -> int | None:
    first, last = self._edges
    if first <= step < last:  # one step per loop: one step marker each
      return step + 1
    return next((edge for edge in self._edges if edge > step), None)

  def due(self, now: actions.Moment) -> bool:
    crossed = any(self._last_step < edge <= now.step for edge in self._edges)
    return crossed or super().due(now)

  def start(self, now: actions.Moment) -> None:
    super().start(now)
    self._finishing = False
    self._update(now)  # resumed inside the window: trace the rest

  def __call__(self, now: actions.Moment) -> None:
    # Training ends after this call: a trace started now would never stop.
    self._finishing = now.end or now.stopping
    return super().__call__(now)

  def _update(self, now: actions.Moment) -> None:
    """Traces iff the steps after `now.step` are in the window."""
    first, last = self._edges
    wanted = (self._workdir is not None and first <= now.step < last and
              not self._finishing)
    if wanted and not self.tracing:
      self._start(self._workdir.train_events)  # TensorFlow adds the rest
      self.tracing = True
      logging.info("Profiling train steps %d-%d into %s", now.step + 1, last,
                   self._workdir.profile)
    elif self.tracing and not wanted:
      self.tracing = False  # over even if its trace is refused (TensorFlow's)
      with files.on_full_disk(self._workdir.profile, "the profile",
                              self._workdir.checkpoints):
        self._stop()
      logging.info("Wrote the profile up to step %d to %s; TensorBoard's"
                   " Profile tab shows it (pip install"
                   " tensorboard-plugin-profile)", now.step,
                   self._workdir.profile)


def config() -> ml_collections.ConfigDict:
  """The `profile` block: each field's default (its doc above it);
  profile.start_step against train.steps spans blocks
  (looper.config.check_steps)."""
  c = ml_collections.ConfigDict()
  c.start_step = fields.whole(0, low=0)
  c.num_steps = fields.whole(5)
  return c
