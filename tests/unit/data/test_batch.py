"""A batch's numbers, computed once from the config and the replica count,
and the one-line errors for a batch that does not split over them."""

import dataclasses

import pytest

from looper import config as lc
from looper.data import batch as batch_lib
from looper.errors import ConfigError


def test_the_numbers_of_an_accumulated_batch_on_four_replicas():
  c = lc.default_config()
  c.train.batch_size, c.train.grad_accum_steps = 96, 3
  c.eval.batch_size = 40
  batch = batch_lib.of(c.train, c.eval, replicas=4)
  # By hand: 3 micro-batches of 96 per update, 24 of each on a replica.
  assert (batch.global_batch_size, batch.micro_batch_size, batch.per_replica,
          batch.accum_steps, batch.replicas) == (288, 96, 24, 3, 4)
  assert (batch.eval_batch_size, batch.eval_per_replica) == (40, 10)
  # Without accumulation an update is one micro-batch.
  c.train.grad_accum_steps = 1
  assert batch_lib.of(c.train, c.eval, replicas=4).global_batch_size == 96


@pytest.mark.parametrize("field,size,replicas,fit", [
    ("train.batch_size", 100, 8, 96),
    ("train.batch_size", 3, 4, 4),  # never below one example per replica
    ("eval.batch_size", 30, 4, 32),
])
def test_a_batch_that_does_not_split_is_one_line_naming_the_field(
    field, size, replicas, fit):
  c = lc.default_config()
  c.train.batch_size, c.eval.batch_size = 64, 64
  block, name = field.split(".")
  c[block][name] = size
  with pytest.raises(ConfigError) as e:
    batch_lib.of(c.train, c.eval, replicas=replicas)
  assert str(e.value) == (
      f"config.{field}={size} is not divisible by the {replicas} replicas;"
      f" set --config.{field}={fit}")


def test_the_same_batch_on_other_replicas_is_checked_again():
  batch = batch_lib.Batch(micro_batch_size=64, replicas=1, eval_batch_size=8)
  assert dataclasses.replace(batch, replicas=8).per_replica == 8
  with pytest.raises(ConfigError, match=r"^config.eval.batch_size=8 is not"
                     r" divisible by the 16 replicas"):
    dataclasses.replace(batch, replicas=16)
  # No eval batch: only the train batch is checked.
  assert batch_lib.Batch(micro_batch_size=4, replicas=2).per_replica == 2


def test_parts_of_an_example_with_and_without_a_weight():
  assert batch_lib.parts(("x", "y")) == ("x", "y", None)
  assert batch_lib.parts(("x", "y", "w")) == ("x", "y", "w")
