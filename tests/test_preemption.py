"""StopOnSignal in this process: the first signal asks, the second exits."""

import os
import signal
import time

from looper import preemption


def wait_until(condition, timeout=5.0):
  deadline = time.monotonic() + timeout
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.01)
  return condition()


def test_first_signal_requests_a_stop_and_the_second_exits(monkeypatch):
  requested, exits = [], []
  # The watcher thread would end the test process: record the call instead.
  monkeypatch.setattr(os, "_exit", exits.append)
  before = signal.getsignal(signal.SIGTERM)
  with preemption.StopOnSignal(requested.append):
    os.kill(os.getpid(), signal.SIGTERM)
    assert wait_until(lambda: requested), "no stop was requested"
    os.kill(os.getpid(), signal.SIGINT)
    assert wait_until(lambda: exits), "the second signal did not exit"
  assert requested == ["SIGTERM"]
  assert exits == [128 + signal.SIGINT]
  assert signal.getsignal(signal.SIGTERM) is before  # handlers restored

