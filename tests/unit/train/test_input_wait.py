"""`input_wait_fraction`: the share of a train call spent waiting for batches,
and what the progress line says to try in each input mode."""

import logging
import os
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from looper.data import shards
from looper.data import sources
from looper.workdir import lines
from looper.options import distribute
from tests.fixtures import forks
from tests.fixtures import pieces
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV


def _slow_dataset_fn(config, split):
  """tiny's examples behind a 1 ms sleep each: input-bound by far."""
  def nap(x, y):
    x = tf.py_function(lambda v: (time.sleep(0.001), v)[1], [x], tf.float32)
    return tf.ensure_shape(x, [tiny.FEATURES]), y
  return tiny.dataset_fn(config, split).map(nap)


def _resident():
  """In memory (array mode) and enough compute per step to dominate."""
  config = tiny.get_config()
  config.data.as_arrays = True
  config.model.width, config.train.batch_size = 4096, 512
  return config


def _fraction(config, strategy=None):
  trainer = pieces.trainer(config, strategy or tf.distribute.get_strategy())
  trainer.train(5)  # the trace
  return np.median([trainer.train(20)[1]["input_wait_fraction"]
                    for _ in range(3)])


@pytest.mark.slow  # trains or compiles for seconds
def test_a_slow_dataset_waits_and_a_resident_one_does_not():
  slow = tiny.get_config()
  slow.dataset_fn = _slow_dataset_fn
  assert _fraction(slow) > 0.8
  assert _fraction(_resident()) < 0.3


def pinned_fraction() -> float:
  """`_resident`'s input wait in this process, pinned to one CPU, with the
  strategy looper builds (distribute.two_op_threads)."""
  os.sched_setaffinity(0, {0})
  config = _resident()
  return _fraction(config, distribute.strategy_for(config.distribution))


@pytest.mark.slow  # a process of its own: TensorFlow's pools are per process
def test_one_cpu_still_tells_compute_from_waiting():
  # One inter-op thread (TensorFlow's default on one CPU) put the step's
  # ops inside the timed get_next: 0.95 measured without two_op_threads.
  proc = forks.run(
      [sys.executable, "-c", "from tests.unit.train import test_input_wait as t;"
       " print(t.pinned_fraction())"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=PYTHONPATH, **LOOPBACK_ENV),
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert float(proc.stdout.split()[-1]) < 0.3


def test_the_train_line_advises_an_input_bound_run_once(caplog):
  out = lines.Progress(total_steps=100, input_hint="element mode: X")
  logs = dict(loss=1.0, steps_per_sec=10.0, input_wait_fraction=0.05)
  with caplog.at_level(logging.INFO):
    out.write_scalars(10, logs)
    out.write_scalars(20, {**logs, "input_wait_fraction": 0.42})
    # A tiny model on resident data: 42% of 0.25 ms is the iterator's own
    # ~0.1 ms per step, which no faster dataset_fn removes.
    out.write_scalars(30, {**logs, "input_wait_fraction": 0.42,
                           "steps_per_sec": 4000.0})
    out.write_scalars(40, {**logs, "input_wait_fraction": 0.5})  # said
  said = [r.getMessage() for r in caplog.records]
  rows = [m for m in said if m.startswith("train step")]
  assert [m.split()[2] for m in rows] == ["10/100", "20/100", "30/100",
                                          "40/100"]
  assert rows[2].split()[-2] == "4.00k"  # steps/s, then the ETA
  advice = [" ".join(m.split()) for m in said if "input" in m]  # unwrapped
  assert advice == [
      "input-bound: the loop to step 20 waited for data 42% of its time"
      " (each loop's: metrics.jsonl's input_wait_fraction); element mode: X"]


def _files(config, split):
  """File mode, never read: its counts are given."""
  return shards.Files(["/nonexistent/shard-0.tfrecord"], counts=[64],
                      parse=lambda r: (tf.zeros([tiny.FEATURES]), 0))


@pytest.mark.parametrize("mode, fields", [
    ("element", {}), ("array", {"data.as_arrays": True}),
    ("file", {"dataset_fn": _files}),
    ("service", {"data.service": "localhost:5050"})])
def test_the_hint_is_what_helps_in_the_run_s_input_mode(mode, fields):
  config = configured(tiny.get_config(), fields)
  hint = pieces.input(config, tf.distribute.get_strategy()).faster()
  assert hint == sources.FASTER[mode]
  assert hint.startswith(f"{mode} mode: " if mode != "service" else
                         "data.service: ")
  # Never what the run does already (array mode was told to switch to it).
  in_use = "data.service" if mode == "service" else f"{mode} mode"
  assert in_use not in hint.split(": ", 1)[1], hint
