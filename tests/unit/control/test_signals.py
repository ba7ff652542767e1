"""StopOnSignal in this process: the first signal asks, the second exits;
the signal's name is the stop's reason."""

import os
import signal
import time

from looper.control import signals
from looper.train import stopping


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
  with signals.StopOnSignal(requested.append):
    os.kill(os.getpid(), signal.SIGTERM)
    assert wait_until(lambda: requested), "no stop was requested"
    os.kill(os.getpid(), signal.SIGINT)
    assert wait_until(lambda: exits), "the second signal did not exit"
  assert requested == ["SIGTERM"]
  assert exits == [128 + signal.SIGINT]
  assert signal.getsignal(signal.SIGTERM) is before  # handlers restored



def test_the_signal_is_the_stop_flags_reason():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  stop = stopping.StopFlag(tf.distribute.get_strategy())
  assert not stop.requested and stop.reason is None
  with signals.StopOnSignal(stop.request):
    os.kill(os.getpid(), signal.SIGTERM)
    assert wait_until(lambda: stop.requested), "no stop was requested"
  assert stop.reason == "SIGTERM"
  stop.request("SIGINT")  # the first reason is kept
  assert stop.reason == "SIGTERM" and bool(stop.flag.numpy())
