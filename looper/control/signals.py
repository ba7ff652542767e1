"""Stopping on SIGTERM/SIGINT: finish the step, save, exit 0; twice: exit now.

Synopsis::

    with signals.StopOnSignal(trainer.stop.request):
      controller.train()          # returns early, saved, after a signal

Why a thread: Python runs signal handlers only between bytecodes of the
main thread, and the main thread spends a train loop inside one TensorFlow
call. `signal.set_wakeup_fd` makes the C-level handler write the signal
number to a pipe at once; a watcher thread reads it and calls
`request_stop(signal_name)` (the trainer's `stop.request`, looper.train.stopping),
which sets a variable the running train loop reads before every step. So a
loop of any length stops within a step, and the Controller then saves a
checkpoint at the step reached. A second signal ends the process
at once with the usual exit code (128 + signal number).

Under multi-worker the stop must happen at the same step on every worker:
there the Trainer does not cut a loop short; before each loop the workers
agree (one all-reduce) whether any of them was asked to stop, and all stop
and save at that step. This must be entered after the strategy is built:
MultiWorkerMirroredStrategy installs a C++ SIGTERM handler of its own.
(Why not TensorFlow's PreemptionCheckpointHandler: see BUILD.md. The
notices a Google Cloud VM gets before SIGTERM: looper.control.vm_notices.)
"""

import os
import signal
import threading
from typing import Callable

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal:
  """A context in which SIGTERM/SIGINT call `request_stop(signal_name)`."""

  def __init__(self, request_stop: Callable[[str], None],
               signals=SIGNALS):
    self._request_stop = request_stop
    self._signals = signals
    self._old = {}
    self._pipe = None
    self._thread = None
    self._old_fd = -1

  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      # Handlers can only be installed from the main thread (e.g. a test
      # runner's worker thread): run without them.
      logging.warning("Not in the main thread: SIGTERM/SIGINT will not"
                      " save a checkpoint before exiting.")
      return self
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    self._pipe = (read_fd, write_fd)
    self._old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for sig in self._signals:
      # The Python-level handler does nothing: the watcher thread acts.
      self._old[sig] = signal.signal(sig, lambda signum, frame: None)
    self._thread = threading.Thread(target=self._watch, name="looper-signals",
                                    daemon=True)
    self._thread.start()
    return self

  def _watch(self):
    read_fd = self._pipe[0]
    received = 0
    while True:
      data = os.read(read_fd, 1)
      if not data or data == b"\0":  # closed by __exit__
        return
      signum = data[0]
      if signum not in [int(s) for s in self._signals]:
        continue
      name = signal.Signals(signum).name
      received += 1
      if received == 1:
        logging.warning("Received %s: stopping after the current step and"
                        " saving a checkpoint (send it again to exit now).",
                        name)
        self._request_stop(name)
      else:
        logging.warning("Received %s again: exiting now, without saving.",
                        name)
        logging.flush()
        os._exit(128 + signum)  # pylint: disable=protected-access

  def __exit__(self, *exc):
    if self._pipe is None:
      return False
    for sig, old in self._old.items():
      signal.signal(sig, old)
    signal.set_wakeup_fd(self._old_fd)
    os.write(self._pipe[1], b"\0")
    self._thread.join(timeout=5)
    for fd in self._pipe:
      os.close(fd)
    self._pipe = None
    return False
