"""How the Trainer's step is made, each option from its own block: `StepOptions`.

Synopsis (what looper.run.pieces.trainer builds from the config)::

    options = StepOptions(precision="mixed_bfloat16",  # train.precision
                          jit_compile=False,       # train.jit_compile
                          dense_gradients=False,   # data.bucket
                          class_weights={0: 1.0, 1: 4.0},  # data.class_weights
                          clip_norm=1.0,           # optimizer.clip_global_norm
                          shard=True,              # distribution.shard_optimizer
                          ema_decay=0.999,         # optimizer.ema_decay
                          health=True,             # train.health_metrics
                          grad_norm=False)         # train.grad_norm
    trainer = Trainer(config, strategy, data, batch, options=options, ...)

    with strategy.scope():                         # what the Trainer does
      with options.policy():
        model = build_model()                      # its layers keep the policy
      optimizer = options.wrap(build_optimizer())  # loss scaling, if float16
      health = options.watch(strategy, model.trainable_variables)  # or None
      optimizers.after_sum(optimizer, clip_norm=options.clip_norm,
                           observe=health.observe if options.grad_norm else None)
      update = options.updater(optimizer, model.trainable_variables,
                               strategy)           # its slots built: now
      ema = options.average(update)                # None without ema_decay

The Trainer is the step math and reads only its own blocks
(looper.train.trainer); these say how its step is made, each read from its
own block by the run (looper.run.pieces): the dtype policy and loss scaling
(looper.options.precision), XLA around the forward and backward pass,
dense gradients (a variable-length batch's sparse ones change size), the
class weights of the train loss, the clipping of the summed gradient
(looper.options.optimizers.after_sum), the optimizer's state sharded over
the replicas (looper.options.sharding), the weight average eval and
export use (looper.options.ema) and the health figures that watch the
update (looper.measure.health). Loss scaling and the weight average stay
where Keras keeps them, on the optimizer. The defaults make a plain step.
"""

import dataclasses
from typing import Any

import keras
import tensorflow as tf

from looper.measure import health as health_lib
from looper.options import precision as precision_lib
from looper.options import sharding


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How the Trainer's step is made (see module doc)."""
  precision: str = "float32"  # a key of looper.options.precision.PRECISIONS
  jit_compile: bool = False  # XLA compiles Trainer.compute_gradients
  dense_gradients: bool = False  # sparse gradients made dense
  class_weights: Any = None  # {class id: weight} of the train loss; None
  clip_norm: float = 0.0  # the summed gradient's global norm at most (0: off)
  shard: bool = False  # the optimizer's slots 1/N per replica (ZeRO 1)
  ema_decay: float = 0.0  # the weight average's decay (0: none)
  health: bool = False  # the weights' norm and update ratio per loop
  grad_norm: bool = False  # each update's gradient norm, per loop

  def policy(self):
    """A context to build the model in: its layers keep the dtype policy."""
    return precision_lib.policy(self.precision)

  def wrap(self, optimizer: keras.optimizers.Optimizer
           ) -> keras.optimizers.Optimizer:
    """`optimizer` under dynamic loss scaling if the precision needs it."""
    return precision_lib.wrap(optimizer, self.precision)

  def updater(self, optimizer, variables, strategy: tf.distribute.Strategy):
    """`optimizer` built for `variables`, sharded or not (in the strategy's
    scope: Keras 3 makes slots lazily, which fails inside a loop of more
    than one replica, "must feed a value for placeholder")."""
    return sharding.updater(optimizer, variables, strategy, shard=self.shard)

  def average(self, updater):
    """The weight average `updater` keeps (sharded with it), or None."""
    return updater.average(self.ema_decay) if self.ema_decay else None

  def watch(self, strategy: tf.distribute.Strategy, weights):
    """The health figures of the updates to `weights`, or None."""
    if not (self.health or self.grad_norm):
      return None
    return health_lib.Health(strategy, weights, gradients=self.grad_norm,
                             weight_figures=self.health)
