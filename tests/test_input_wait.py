"""`input_wait_fraction`: the share of a train call spent waiting for batches."""

import logging
import time

import numpy as np
import pytest
import tensorflow as tf

from looper import workdir
from looper.train import trainer as trainer_lib
from looper.workdir import summaries
from tests import tiny


def _slow_dataset_fn(config, split):
  """tiny's examples behind a 1 ms sleep each: input-bound by far."""
  def nap(x, y):
    x = tf.py_function(lambda v: (time.sleep(0.001), v)[1], [x], tf.float32)
    return tf.ensure_shape(x, [tiny.FEATURES]), y
  return tiny.dataset_fn(config, split).map(nap)


def _fraction(config):
  trainer = trainer_lib.Trainer(config, tf.distribute.get_strategy())
  trainer.train(5)  # the trace
  return np.median([trainer.train(20)[1]["input_wait_fraction"]
                    for _ in range(3)])


@pytest.mark.slow  # trains or compiles for seconds
def test_a_slow_dataset_waits_and_a_resident_one_does_not():
  slow = tiny.get_config()
  slow.dataset_fn = _slow_dataset_fn
  assert _fraction(slow) > 0.8
  # In memory (array mode) and enough compute per step to dominate.
  resident = tiny.get_config()
  resident.data.as_arrays = True
  resident.model.width, resident.train.batch_size = 4096, 512
  assert _fraction(resident) < 0.3


def test_the_progress_line_names_an_input_bound_run(tmp_path, caplog):
  out = summaries.Summaries(workdir.Workdir(str(tmp_path)), chief=True,
                            total_steps=100)
  logs = dict(loss=1.0, steps_per_sec=10.0, input_wait_fraction=0.05)
  with caplog.at_level(logging.INFO):
    out.progress(10, logs)
    out.progress(20, {**logs, "input_wait_fraction": 0.42})
    # A tiny model on resident data: 42% of 0.25 ms is the iterator's own
    # ~0.1 ms per step, which no faster dataset_fn removes.
    out.progress(30, {**logs, "input_wait_fraction": 0.42,
                      "steps_per_sec": 4000.0})
  first, second, tiny_model = [r.getMessage() for r in caplog.records
                               if "train step" in r.getMessage()]
  assert "input" not in first and "loss=1" in first
  assert "input" not in tiny_model and "| 4k steps/s |" in tiny_model
  assert second.endswith(
      "| input-bound: 42% of the time waiting for data (faster dataset_fn:"
      " cache, parallel map; or file/array mode, see BUILD.md 'Input"
      " modes')")
  out.close()
