"""The optimizer's state sharded over the replicas: ZeRO stage 1 (`distribution.shard_optimizer`).

Synopsis::

    with strategy.scope():
      update = sharding.updater(optimizer, model.trainable_variables,
                                strategy, shard=True)  # builds on shards
    update.apply(grads)                       # a replica's step: the update
    checkpoint_items["optimizer"] = update.checkpointed()
    sharding.per_device(strategy, update)     # the state's bytes per device

Each weight is flattened and padded to N * k elements (k = ceil(size / N),
N replicas); replica r owns elements [r k, (r + 1) k): a weight shard of
its own and the optimizer's slots for it (Adam's two moments, SGD's
momentum), on its device. One update, in every replica::

    shard <- slice r of the weight          # the weights may have moved:
                                            # a restore, a roll-back
    optimizer.apply(grads, shards)          # Keras' own: sums the grads over
      # the replicas (all-reduce), clips the sum (clip_global_norm), keeps
      # slice r of it (the hook below), decays and updates the shards and
      # their slots with its update_step
    weight <- all_gather(shards)[:size]     # the same on every replica

So the update math is the optimizer's own, applied elementwise to slices
(the same numbers as on the whole weight: exact), and the weights stay
whole on every replica for the forward pass. The gradient is still summed
whole (stage 1: the all-reduce, then N-1 of N slices unused); the state is
what shrinks: ceil(P / N) x slots per device plus the weight shard.

The shards and slots are Keras variables made in the strategy's scope,
whose per-device components hold different slices (written only inside
`extended.update`, which gives each component its replica's value); they
are never read whole. A checkpoint holds the optimizer as a replicated run
saves it (`checkpointed`: each slot gathered to its weight's shape), so
checkpoints move between replica counts and to and from replicated runs.

`refusal` says in one line why a strategy or an optimizer cannot shard:
TPUStrategy (its variables, not shown yet), and optimizers whose update of
an element depends on others of its weight (Adafactor's factored moments,
Muon's orthogonalisation, Lamb's trust ratio): SHARDABLE names the
elementwise ones.
"""

import contextlib
import math

import keras
import tensorflow as tf

from looper import compat
from looper.errors import ConfigError

# Keras' elementwise optimizers (each element's update reads only its own
# gradient and slots) and their subclasses; AdamW is an Adam.
SHARDABLE = (keras.optimizers.SGD, keras.optimizers.Adam,
             keras.optimizers.Adamax, keras.optimizers.Nadam,
             keras.optimizers.RMSprop, keras.optimizers.Adagrad,
             keras.optimizers.Adadelta, keras.optimizers.Lion,
             keras.optimizers.Ftrl)


def refusal(strategy: tf.distribute.Strategy, optimizer) -> str | None:
  """Why `distribution.shard_optimizer=True` cannot run with `strategy`
  and `optimizer` (the inner one under loss scaling), or None."""
  fix = "set --config.distribution.shard_optimizer=False"
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return ("config.distribution.shard_optimizer=True: not shown on"
            f" TPUStrategy yet (its variables and update path); {fix}")
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return ("config.distribution.shard_optimizer=True: ParameterServerStrategy"
            f" updates its variables asynchronously, on its servers; {fix}")
  if not isinstance(optimizer, SHARDABLE):
    return (f"config.distribution.shard_optimizer=True: the optimizer"
            f" {type(optimizer).__name__} updates an element from others of"
            f" its weight (shape-dependent), which a slice does not hold;"
            f" use one of {', '.join(c.__name__ for c in SHARDABLE)}, or {fix}")
  return None


class Sharded:
  """An optimizer whose slots live 1/N per replica (see module doc)."""

  def __init__(self, variables, optimizer, strategy: tf.distribute.Strategy):
    """Call in `strategy.scope()`, with `optimizer` (a LossScaleOptimizer's
    inner one owns the slots) not yet built; builds it on the shards."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    why = refusal(strategy, inner)
    if why:
      raise ConfigError(why)
    self.variables = list(variables)
    self.optimizer = optimizer
    self.strategy = strategy
    self.replicas = strategy.num_replicas_in_sync
    self.shards = [self._shard(v) for v in self.variables]
    # Its exclusions by variable (var_list=) name the weights: the same
    # decision, moved to their shards.
    excluded = [s for v, s in zip(self.variables, self.shards)
                if not compat.uses_weight_decay(inner, v.value)]
    if excluded:
      inner.exclude_from_weight_decay(var_list=excluded)
    # Which weight each slot was made for (`checkpointed`).
    self._slot_of = {}
    index = {id(s): i for i, s in enumerate(self.shards)}
    make = inner.add_variable_from_reference

    def recorded(reference, *args, **kwargs):
      slot = make(reference, *args, **kwargs)
      self._slot_of[id(slot)] = index[id(reference)]
      return slot
    inner.add_variable_from_reference = recorded
    try:
      optimizer.build(self.shards)
    finally:
      del inner.add_variable_from_reference  # the class's again
    self._inner = inner
    compat.after_all_reduce(optimizer, self._own_slices)

  def _shard(self, weight) -> keras.Variable:
    """This replica's part of `weight`, under its name and scope: AdamW's
    exclusion patterns (exclude_from_weight_decay(var_names=)) match the
    TensorFlow variable's name, so they decide for it as for the weight."""
    with contextlib.ExitStack() as scopes:
      for part in weight.path.split("/")[:-1]:
        scopes.enter_context(keras.name_scope(part))
      return keras.Variable(tf.zeros([self._rows(weight)], weight.dtype),
                            name=weight.name, trainable=False)

  def _rows(self, variable) -> int:
    return math.ceil(variable.shape.num_elements() / self.replicas)

  def _slice(self, tensor, rows: int, replica=None):
    """Replica `replica`'s (default: this one's) `rows` elements of
    `tensor`, flattened and padded; the id may be a tensor (a TPU's)."""
    flat = tf.reshape(tf.convert_to_tensor(tensor), [-1])
    flat = tf.pad(flat, [[0, rows * self.replicas - flat.shape[0]]])
    if replica is None:
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.slice(flat, [tf.cast(replica, tf.int32) * rows], [rows])

  def _own_slices(self, grads_and_vars):
    """After Keras' all-reduce (and the clip of the sum): this replica's
    slice of each summed gradient, for its shard."""
    return [(None if g is None else self._slice(g, s.shape[0]), s)
            for g, s in grads_and_vars]

  def apply(self, grads) -> None:
    """One update from this replica's gradients (replica context)."""
    if any(isinstance(g, tf.IndexedSlices) for g in grads):
      # Measured: sharded, an Embedding's curve left the replicated one
      # (tests.stress.zero --cases embedding); refused when traced.
      raise ConfigError(
          "config.distribution.shard_optimizer=True: a sparse gradient (an"
          " Embedding's) cannot be sharded yet; set"
          " --config.distribution.shard_optimizer=False")
    context = tf.distribute.get_replica_context()
    _assign_each(context, [s.value for s in self.shards],
                 [self._slice(v.value, s.shape[0])
                  for v, s in zip(self.variables, self.shards)])
    self.optimizer.apply(grads, self.shards)
    whole = context.all_gather([s.value.read_value() for s in self.shards],
                               axis=0)
    _assign_each(context, [v.value for v in self.variables], [
        _constrained(v, tf.reshape(w[:v.shape.num_elements()], v.shape))
        for v, w in zip(self.variables, whole)])

  # --- Checkpoints ----------------------------------------------------------

  def whole_slot(self, slot) -> tf.Tensor:
    """A slot gathered from the replicas, in its weight's shape (cross-
    replica context; under multi-worker a collective: every worker
    saves)."""
    weight = self.variables[self._slot_of[id(slot)]]
    if compat.in_multi_worker_mode(self.strategy):  # a collective
      flat = self.strategy.gather(slot.value, axis=0)
    else:  # the devices' parts, in replica order (no retraced gather)
      flat = tf.concat(self.strategy.experimental_local_results(slot.value),
                       axis=0)
    return tf.reshape(flat[:weight.shape.num_elements()], weight.shape)

  def restore_slot(self, slot, value: tf.Tensor) -> None:
    """Sets each replica's part of `slot` from its whole `value`."""
    parts = self.strategy.experimental_distribute_values_from_function(
        lambda context: self._slice(value, slot.shape[0],
                                    context.replica_id_in_sync_group))
    self.strategy.extended.update(slot.value, lambda s, x: s.assign(x),
                                  args=(parts,))

  def checkpointed(self):
    """What a checkpoint holds for the optimizer: the layout a replicated
    run's optimizer saves, each slot whole (see module doc)."""
    return compat.optimizer_layout(self._inner, self.variables, {
        slot: (lambda v=v: self.whole_slot(v),
               lambda value, v=v: self.restore_slot(v, value))
        for slot, v in ((id(v), v) for v in self._inner.variables
                        if id(v) in self._slot_of)})


def _constrained(variable, value):
  """`value` through the weight's constraint, as Keras applies it after
  an update (a max-norm reads the whole weight: here it is whole)."""
  return value if variable.constraint is None else variable.constraint(value)


def _assign_each(context, variables, values) -> None:
  """Each replica's `values` into its component of `variables` (the
  strategy's update path: one merge call)."""
  def update(strategy, values):
    for variable, value in zip(variables, values):
      strategy.extended.update(variable, lambda v, x: v.assign(x),
                               args=(value,), group=False)
  context.merge_call(update, args=(values,))


def state_bytes(strategy: tf.distribute.Strategy,
                variables) -> dict[str, int]:
  """Bytes of `variables` on each device, from their components."""
  where = {}
  for variable in variables:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    for part in strategy.experimental_local_results(value):
      where[part.device] = where.get(part.device, 0) + (
          part.shape.num_elements() * part.dtype.size)
  return where


def per_device(strategy: tf.distribute.Strategy, update,
               average=None) -> int:
  """The optimizer's state on the device holding most, in bytes: its
  variables (slots, step, a loss scale), the weight shards of a Sharded
  `update` and the weight average (`average`, an ema.WeightAverage)."""
  variables = list(update.optimizer.variables)
  variables += getattr(update, "shards", [])
  if average:
    variables += average.averages
  return max(state_bytes(strategy, variables).values(), default=0)


class Replicated:
  """The optimizer as Keras builds it: its slots whole on every replica."""

  def __init__(self, variables, optimizer):
    self.variables, self.optimizer = list(variables), optimizer
    optimizer.build(self.variables)

  def apply(self, grads) -> None:
    self.optimizer.apply_gradients(zip(grads, self.variables))

  def checkpointed(self):
    """The inner optimizer under loss scaling (the slots' owner)."""
    return getattr(self.optimizer, "inner_optimizer", self.optimizer)


def updater(optimizer, variables, strategy: tf.distribute.Strategy, *,
            shard: bool):
  """`optimizer` built for `variables` (in the strategy's scope): Sharded
  (distribution.shard_optimizer) or Replicated; `.apply(grads)` in a
  replica step, `.checkpointed()` what a checkpoint holds."""
  if shard:
    return Sharded(variables, optimizer, strategy)
  return Replicated(variables, optimizer)
