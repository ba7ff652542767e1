"""Epochs as steps: train.epochs, eval.every_epochs, checkpoint.every_epochs.

Synopsis (what `looper.run.run` does before it builds the Trainer, through
looper.config.resolve_epochs, which sets the steps fields of a copy)::

    steps, epoch = epochs.resolve({"train.steps": 2.5}, data,
                                  split="train", bucket=0)
    steps                      # {'train.steps': 1172}: what 2.5 epochs are
    epoch.of(500)              # 500 steps are this many epochs
    console.header(..., epoch=epoch)   # "469 = 1.001 epochs of ..."

A Keras user counts epochs; looper counts steps, optimizer updates of
train.batch_size x train.grad_accum_steps examples. Each length a config
gives in epochs has a twin in steps (config.IN_EPOCHS), and a config sets
one of the two. `resolve` turns the epochs into steps once (given the
train split and data.bucket, not the config), before the Trainer is
built, so everything after it reads one number: the
Controller, the learning-rate schedule, the header, describe, TensorBoard's
HParams and config.json (which keeps the epochs asked for beside the
steps they came to).

N epochs are ceil(N x E) updates, E the updates in one epoch:
- array, file and element mode: E = the split's examples / the examples of
  an update. A Keras epoch is ceil(examples / batch) batches, its last one
  partial; looper's train batches are all whole and run on across an
  epoch's end (the next epoch's first examples fill the last one), so
  there is no partial batch to round to. Rounding up keeps Keras' promise
  that N epochs show every example N times; the last update takes less
  than an update's worth of epoch N + 1. Element mode does not know its
  size: it is counted by one pass, and the header says so.
- bucket mode (data.bucket): an epoch is exactly the whole batches of its
  length buckets (each bucket's last partial batch is dropped:
  looper.data.buckets), E = those batches / train.grad_accum_steps.
E depends on the global batch only: the same on every topology.
A fraction of an epoch is allowed (train.epochs=2.5, eval.every_epochs=
0.5): nothing in looper's stream happens at an epoch's end, and one
epoch of a large dataset is hours. every_epochs=K evaluates (or saves)
every ceil(K x E) steps, a fixed period like every_steps.
"""

import dataclasses
import fractions
import math

from looper.data import buckets
from looper.data import input as input_lib


@dataclasses.dataclass(frozen=True)
class Epoch:
  """One pass over the train split, as the run's updates see it."""
  examples: int  # in the pass
  updates: fractions.Fraction  # optimizer updates per epoch (E)
  counted: bool  # the size was counted by one pass (element mode)
  batches: int | None = None  # bucket mode: its whole batches

  def steps(self, epochs: float) -> int:
    """The updates of `epochs` epochs, ceil(epochs x E): at least 1."""
    # From the decimal the user wrote: 0.3 x 1000 / 100 is 3, not 4.
    return math.ceil(fractions.Fraction(str(epochs)) * self.updates)

  def of(self, steps: int) -> float:
    """How many epochs `steps` updates are."""
    return float(steps / self.updates)

  def __str__(self) -> str:  # what an epoch is of, for the header
    batches = f" in {self.batches:,} batches" if self.batches else ""
    return (f"{self.examples:,}{batches}"
            + (" (counted by one pass)" if self.counted else ""))


def measure(data: input_lib.Input, *, split: str, bucket: int = 0) -> Epoch:
  """The epoch of the train split `split`, of `data`'s batch (its numbers:
  data.batch), in length buckets of `bucket` (data.bucket) if set;
  counted by one pass if its size is unknown."""
  batch = data.batch
  if bucket:
    examples, batches = buckets.epoch_batches(
        data.examples(split), batch_size=batch.micro_batch_size,
        bucket=bucket, split=split)
    return Epoch(examples, fractions.Fraction(batches, batch.accum_steps),
                 counted=True, batches=batches)
  counted = data.source(split).size is None
  examples = data.size(split)
  return Epoch(examples, fractions.Fraction(
      examples, batch.global_batch_size), counted=counted)


def resolve(asked: dict[str, float], data: input_lib.Input, *, split: str,
            bucket: int = 0, known: bool = True, count: bool = False
            ) -> tuple[dict[str, int], Epoch | None]:
  """({steps field: its steps}, the train split's Epoch or None).

  `asked`: {steps field: the epochs its twin asks for} ('train.steps':
  2.5), each made ceil(epochs x E) steps. The Epoch (of `split`, bucketed
  by `bucket`: `measure`) is measured whenever `asked` needs it; else if
  `known` and the size is known without a pass, or if `count` (describe,
  which counts its splits anyway). `known=False`: a run that may never
  read the train split (eval) does not read it for the header.
  """
  if not (asked or count or
          (known and data.source(split).size is not None)):
    return {}, None
  epoch = measure(data, split=split, bucket=bucket)
  return {steps: epoch.steps(n) for steps, n in asked.items()}, epoch
