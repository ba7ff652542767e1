"""The step and its loop: the Trainer, the train loop, evaluation.

| module | owns |
|---|---|
| `trainer` | the `Trainer`: state built in scope, the seams a subclass overrides |
| `loop` | `TrainLoop`: K steps of a replica step function in one tf.function, the loss buffer; no Trainer in it |
| `evaluator` | `Evaluator`: one exact pass over the eval split, the weight-average swap |
| `stopping` | a stop request agreed across workers inside the loop (`StopFlag`) |
| `randomness`, `layers` | Keras' own random layers (their state in the checkpoint, replica-invariant draws); looper's replica-invariant noise layers |

When the loop runs and what runs between loops: `looper.control`; what a
step costs and how it went: `looper.measure`. The options (losses,
metrics, optimizers, precision, distribution) come from `looper.options`,
data from `looper.data`; what is written goes through `looper.workdir`.

The `train` block, how a run trains (its length, batch, loop, precision,
the roll-backs and stops), is declared here (`config()`) and checked
here (`check`); the rules it shares with other blocks (steps or epochs,
the bounds train.steps sets) are looper.config's.
"""

import ml_collections

from looper import fields
from looper.options import precision


def config() -> ml_collections.ConfigDict:
  """The `train` block: each field's default (its doc above it)."""
  c = ml_collections.ConfigDict()
  # How long to train: optimizer updates, or epochs of the train split
  # (a fraction too: 2.5), which looper.control.epochs turns into updates,
  # rounded up. Set one, the other 0 (IN_EPOCHS).
  c.steps = fields.whole(0, low=0)
  c.epochs = fields.epochs()
  c.batch_size = fields.whole(128)  # GLOBAL, split evenly over the replicas
  # Steps run inside one tf.function call; evaluation, checkpoints and the
  # end clamp a loop so they land exactly on their step.
  c.steps_per_loop = fields.whole(100)
  # On a NaN/inf loss (or a spike): restore the last checkpoint, skip the data
  # that blew up and go on, at most this many times; 0 stops with an error.
  c.nan_recovery_tries = fields.whole(0, low=0)
  # Roll back a loop whose top step loss > this x the recent median; 0: off.
  c.spike_factor = fields.Field(0.0, float, "a factor", 1, above=True, off=0)
  # Per loop: the weights' norm and the update ratio (measure/health.py).
  c.health_metrics = fields.boolean(True)
  # Per update: the gradient's norm (grad_norm, grad_norm_max); off by
  # default, as it reads every gradient once more (~1.5% of a small step).
  c.grad_norm = fields.boolean(False)
  # Stop after this many evals not bettering checkpoint.best_metric; 0: never.
  c.early_stop_patience = fields.whole(0, low=0)
  # float32 | mixed_bfloat16 (TPU, CPU with AMX or AVX-512 BF16) |
  # mixed_float16 (GPU, with loss scaling): see looper/options/precision.py.
  c.precision = "float32"
  # XLA-compile each replica's forward and backward pass (not the loop).
  c.jit_compile = fields.boolean(False)
  # Op determinism and no TF32 (GPU matmuls at float32, not 10-bit inputs): the
  # exact contracts on GPUs, at some speed; no input-wait timing; process-wide.
  c.deterministic = fields.boolean(False)
  # Micro-batches of train.batch_size per optimizer update: the update of one
  # batch grad_accum_steps times larger (train.steps counts updates).
  c.grad_accum_steps = fields.whole(1)
  # FLOP/s of a GPU or TPU device, or of a host's CPUs, MFU is the share of; 0:
  # a datasheet's (known GPU, TPU) or matmul probes', cached (measure/peak_flops.py).
  c.peak_flops = fields.Field(0.0, float, "a number of FLOP/s")
  return c


def check(c: ml_collections.ConfigDict) -> None:
  """The `train` block's own rules; ConfigError on the first."""
  fields.check_declared(c, "train")
  fields.check_choice(c.precision, "train.precision", precision.PRECISIONS)
