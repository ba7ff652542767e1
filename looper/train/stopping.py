"""Stopping a running train loop on request, and agreeing on it across workers.

Synopsis::

    stop = stopping.StopFlag(strategy)
    stop.request("SIGTERM")        # any thread, e.g. a signal handler's
    if stop.before_loop(): ...     # multi-worker: all agreed to stop here
    # the train loop's condition, where loops may be cut short:
    more = (tf.logical_and(i < steps, tf.logical_not(stop.flag.read_value()))
            if stop.cuts_loops else i < steps)
    stop.requested                 # whether training stops
    stop.reason                    # why: "SIGTERM"
    stop.agree(flag)               # True if `flag` is true on any worker

One process: the flag is a host variable the loop reads every step, so a
signal stops a loop of any length within a step. Several workers must stop
at the same step (every step is a collective across them), so there a loop
is never cut short: before each loop the workers agree with one
all-reduce whether any of them was asked to stop.

This is the one place a stop request lives, with its reason; the
Controller reads both after each loop (looper.control.controller).
"""

import tensorflow as tf


class StopFlag:
  """A stop request (see module doc); `agree` is also how actions make a
  per-process decision (a clock) the same on every worker."""

  def __init__(self, strategy: tf.distribute.Strategy):
    self._strategy = strategy
    # A plain host variable outside the scope: it is not training state.
    with tf.device("/cpu:0"):
      self.flag = tf.Variable(False, trainable=False, name="stop")
    self.cuts_loops = not isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy)
    self._any_worker_fn = (None if self.cuts_loops else tf.function(
        self._any_worker, autograph=False))
    self._agreed = False
    self._reason = None  # given to `request` in this process

  def request(self, reason: str) -> None:
    """Safe from any thread; takes effect within a step (one process) or
    before the next loop (multi-worker). The first reason is kept."""
    # Before the flag: whoever sees the stop sees its reason.
    self._reason = self._reason or reason
    self.flag.assign(True)

  def before_loop(self) -> bool:
    """Multi-worker: True if any worker was asked to stop (all return the
    same); every worker calls it before each loop. Else False."""
    if self.cuts_loops:
      return False
    if self.agree(self.flag.numpy()):
      self._agreed = True
    return self._agreed

  @property
  def requested(self) -> bool:
    """Whether training stops: a request that took effect (under
    multi-worker, once all workers agreed, before a loop)."""
    if self.cuts_loops:
      return bool(self.flag.numpy())
    return self._agreed

  @property
  def reason(self) -> str | None:
    """Why training stops (what `request` was given, here or, under
    multi-worker, on another worker); None while it does not."""
    if not self.requested:
      return None
    return self._reason or "a stop request on another worker"

  def agree(self, flag: bool) -> bool:
    """True if `flag` is true on any worker (one all-reduce under
    multi-worker); every worker must call it at the same point."""
    if self._any_worker_fn is None:
      return bool(flag)
    return bool(self._any_worker_fn(tf.constant(bool(flag))))

  def _any_worker(self, flag):
    total = self._strategy.run(
        lambda: tf.distribute.get_replica_context().all_reduce(
            "SUM", tf.cast(flag, tf.int32)))
    # Every local replica holds the same cluster-wide sum.
    return self._strategy.experimental_local_results(total)[0] > 0
