"""A batch: its numbers and its parts.

Synopsis::

    batch = batch_lib.of(config.train, config.eval,
                         replicas=strategy.num_replicas_in_sync)
    batch.global_batch_size  # 256: one optimizer update's examples
    batch.micro_batch_size   # 128: what one next() yields over all replicas
    batch.per_replica        # 64: one replica's part of a micro-batch
    batch.accum_steps        # 2: micro-batches per update
    batch.eval_batch_size, batch.eval_per_replica   # 512, 256
    batch.eval_steps         # None: an eval pass takes its whole split
    inputs, label, weight = parts(example)   # of an example or a batch

The numbers are computed once, from the config's train and eval blocks
and the replica count (`of`: the one reader of train.batch_size besides
the train block's check), and passed to whoever needs them: the Input batches
by `micro_batch_size`, the loop takes `accum_steps` batches per step, the
loss is averaged over `global_batch_size` (the name TensorFlow's
`compute_average_loss` gives it), the Controller counts examples per
second by it. A micro-batch that does not split evenly over the replicas
is refused here, in one line, before anything is built.
"""

import dataclasses

from looper.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Batch:
  """A run's batch sizes (see module doc); checked when made."""
  micro_batch_size: int  # train.batch_size: one next() over all replicas
  replicas: int  # replicas in sync (TPU cores for `looper check`)
  accum_steps: int = 1  # train.grad_accum_steps: micro-batches per update
  eval_batch_size: int | None = None  # eval.batch_size; None: not checked
  eval_steps: int | None = None  # eval.steps: an eval pass' batches at most

  def __post_init__(self):
    _check_divisible(self.micro_batch_size, self.replicas, "train.batch_size")
    if self.eval_batch_size is not None:
      _check_divisible(self.eval_batch_size, self.replicas, "eval.batch_size")

  @property
  def global_batch_size(self) -> int:
    """One optimizer update's examples: what the loss is averaged over."""
    return self.micro_batch_size * self.accum_steps

  @property
  def per_replica(self) -> int:
    """One replica's rows of a micro-batch (the step's static slices)."""
    return self.micro_batch_size // self.replicas

  @property
  def eval_per_replica(self) -> int:
    return self.eval_batch_size // self.replicas


def of(train, evaluation, replicas: int) -> Batch:
  """The Batch of the `train` block (batch_size, grad_accum_steps) and the
  `eval` block (`evaluation`: batch_size, steps) on `replicas` replicas."""
  return Batch(micro_batch_size=train.batch_size, replicas=replicas,
               accum_steps=train.grad_accum_steps,
               eval_batch_size=evaluation.batch_size,
               eval_steps=evaluation.steps)


def parts(example) -> tuple:
  """(inputs, label, sample_weight or None) of an example or a batch."""
  inputs, label, *weight = example
  return inputs, label, weight[0] if weight else None


def _check_divisible(size: int, replicas: int, field: str) -> None:
  """Every replica must get the same number of examples."""
  if size % replicas:
    fit = replicas * max(1, round(size / replicas))
    raise ConfigError(
        f"config.{field}={size} is not divisible by the {replicas} replicas;"
        f" set --config.{field}={fit}")
