"""Every option combined with every other: the same run on 1 and 2 replicas.

Options that are each exact alone went wrong together (mixed_float16 with
clipping summed the gradients twice on several replicas; accumulation
crashed on an Embedding's sparse gradients), so each row of COMBINATIONS
sets several at once, and every pair of values of any two options (and
most triples) meets in some row, on a dense model and on one with an
Embedding. Each row trains 6 steps and evaluates (the weight average, if
on, is what eval sees) on 1 replica and on 2, both in the test's process
(the session's 2 logical CPUs: tests/conftest.py); the per-step losses and
the eval loss must agree.
"""

import numpy as np
import pytest

from tests.fixtures.configs import SESSION_CPUS, configured

# precision, optimizer.clip_global_norm, train.grad_accum_steps,
# optimizer.ema_decay, weighted (data.class_weights with
# loss_normalization='weights'), model.embed (0: the dense MLP).
COMBINATIONS = (
    ("float32", 0.0, 1, 0.0, False, 0),
    ("float32", 0.3, 2, 0.9, True, 8),
    ("float32", 0.3, 1, 0.9, False, 8),
    ("float32", 0.0, 2, 0.0, True, 0),
    ("mixed_bfloat16", 0.3, 2, 0.0, False, 0),
    ("mixed_bfloat16", 0.0, 1, 0.9, True, 0),
    ("mixed_bfloat16", 0.3, 1, 0.0, True, 8),
    ("mixed_bfloat16", 0.0, 2, 0.9, False, 8),
    ("mixed_float16", 0.3, 1, 0.9, False, 0),
    ("mixed_float16", 0.3, 2, 0.0, True, 8),
    ("mixed_float16", 0.0, 2, 0.9, True, 0),
    ("mixed_float16", 0.0, 1, 0.0, False, 8),
)
# Float32 sums in another order on 2 replicas; bfloat16 and float16 round
# activations, so one flipped rounding moves a loss by ~2^-8 of an
# activation's share (measured: below 2e-4 here).
RTOL = {"float32": 1e-5, "mixed_bfloat16": 1e-3, "mixed_float16": 1e-3}


def _config(row):
  from tests.fixtures import tiny  # pylint: disable=g-import-not-at-top
  precision, clip, accum, ema, weighted, embed = row
  return configured(
      tiny.get_config(), {
          "train.precision": precision, "optimizer.clip_global_norm": clip,
          "train.grad_accum_steps": accum, "optimizer.ema_decay": ema,
          "model.embed": embed, "data.shuffle_buffer": 0,
          "train.batch_size": 16,
          "loss_normalization": "weights" if weighted else "batch_size",
          "data.class_weights": (1.0, 2.0, 0.5, 1.5) if weighted else (),
          "optimizer.learning_rate": 0.5 if embed else 0.1})


def results(strategy) -> list:
  """Each row's 6 per-step losses and eval loss under `strategy`."""
  from tests.fixtures import pieces  # pylint: disable=g-import-not-at-top
  out, kept = [], []
  for row in COMBINATIONS:
    trainer = pieces.trainer(_config(row), strategy)
    evaluator = pieces.evaluator(trainer)
    losses = trainer.train(6)[0]["loss"].tolist()
    out.append({"losses": losses, "eval": evaluator.evaluate()["loss"]})
    kept.append((trainer, evaluator))
  # Kept to the end (the Trainer's train iterator, the Evaluator's eval
  # iterator): a Mirrored iterator freed while others run stalled the
  # process for 20 s to minutes at a time here (TensorFlow's multi-device
  # iterators; 21 s for this test with both kept, 87 s with the
  # evaluators freed).
  return out


@pytest.mark.slow  # 24 runs: seconds
def test_every_combination_is_the_same_on_1_and_2_replicas():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper.options import distribute  # pylint: disable=g-import-not-at-top
  one = results(tf.distribute.get_strategy())
  two = results(distribute.mirrored(distribute.split_cpu(SESSION_CPUS)))
  for row, a, b in zip(COMBINATIONS, one, two):
    rtol = RTOL[row[0]]
    np.testing.assert_allclose(b["losses"], a["losses"], rtol=rtol,
                               err_msg=str(row))
    np.testing.assert_allclose(b["eval"], a["eval"], rtol=rtol,
                               err_msg=str(row))
    # Training moved the model (a row that learns nothing proves nothing).
    assert a["losses"][-1] != a["losses"][0], row
