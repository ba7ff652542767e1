"""The optimizer's state sharded over the replicas: ZeRO stage 1 (`distribution.shard_optimizer`).

Synopsis::

    with strategy.scope():
      update = sharding.updater(optimizer, model.trainable_variables,
                                strategy, shard=True)  # builds on shards
      average = update.average(0.999)         # optimizer.ema_decay, sharded
    update.refresh()                          # a train loop's start
    update.apply(grads)                       # a replica's step: the update
    checkpoint_items["optimizer"] = update.checkpointed()

Over N >= 2 replicas each weight is flattened and padded to N * k
elements (k = ceil(size / N)); replica r owns elements [r k, (r + 1) k):
a weight shard of its own, the optimizer's slots for it (Adam's two
moments, SGD's momentum) and its weight average, on its device. A train
loop starts by setting each shard from its weight (the weights may have
moved between loops: a restore, a roll-back); then one update, in every
replica::

    optimizer.apply(grads, shards)          # Keras' own: sums the grads over
      # the replicas (all-reduce), clips the sum (clip_global_norm), keeps
      # slice r of it (the hook below; a sparse one stays sparse), decays
      # and updates the shards and their slots with its update_step
    weights <- all_gather(shards)           # a collective per large weight,
                                            # one for the rest end to end

So the update math is the optimizer's own, applied elementwise to slices
(the same numbers as on the whole weight: exact), and the weights stay
whole on every replica for the forward pass. The gradient is still summed
whole (stage 1); the state shrinks: ceil(P / N) x (slots + 1) per device,
the 1 the weight shard: Keras' update_step reads and writes the variable
it is given, and so does its weight decay (`variable.assign_sub`, past the
optimizer's assign methods), so the slice is a variable. On one replica
`updater` updates the weights in place (P x slots, as unsharded).

The shards and slots are Keras variables made in the strategy's scope,
whose per-device components hold different slices (written only inside
`extended.update`); they are never read whole. A checkpoint holds the
optimizer and the average as a replicated run saves them (`checkpointed`),
so checkpoints move between replica counts and replicated runs.

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
from looper.options import ema

# Keras' elementwise optimizers (each element's update reads only its own
# gradient and slots) and their subclasses; AdamW is an Adam.
SHARDABLE = (keras.optimizers.SGD, keras.optimizers.Adam,
             keras.optimizers.Adamax, keras.optimizers.Nadam,
             keras.optimizers.RMSprop, keras.optimizers.Adagrad,
             keras.optimizers.Adadelta, keras.optimizers.Lion,
             keras.optimizers.Ftrl)

ALONE = 1 << 17  # bytes: a weight as large is gathered alone (`gathered`)


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
    inner one owns the slots; `refusal` None) not yet built; builds it on
    the shards."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    self.variables = list(variables)
    self.optimizer = optimizer
    self.strategy = strategy
    self.replicas = strategy.num_replicas_in_sync
    self.shards = [self.shard_of(v) for v in self.variables]
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

  def shard_of(self, weight, name: str | None = None) -> keras.Variable:
    """A variable of ceil(size / N) elements of `weight` per replica (its
    components differ; zeros until set), under the weight's scope and
    `name` (default its own: AdamW's exclusion patterns,
    exclude_from_weight_decay(var_names=), match the TensorFlow variable's
    name, so they decide for the shard as for the weight)."""
    with contextlib.ExitStack() as scopes:
      for part in weight.path.split("/")[:-1]:
        scopes.enter_context(keras.name_scope(part))
      return keras.Variable(tf.zeros([self._rows(weight)], weight.dtype),
                            name=name or weight.name, trainable=False)

  def _rows(self, variable) -> int:
    return math.ceil(variable.shape.num_elements() / self.replicas)

  def _slice(self, tensor, rows: int, replica=None):
    """`part_of` for replica `replica` (default: this one)."""
    if replica is None:
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return part_of(tensor, rows, self.replicas, replica)

  def _own_slices(self, grads_and_vars):
    """After Keras' all-reduce (and the clip of the sum): this replica's
    slice of each summed gradient, for its shard."""
    return [(None if g is None else
             _sparse_slice(g, s.shape[0]) if isinstance(g, tf.IndexedSlices)
             else self._slice(g, s.shape[0]), s)
            for g, s in grads_and_vars]

  def refresh(self) -> None:
    """Each shard from its weight (cross-replica context, in the train
    function before its steps): the weights may have moved since the last
    update (a restore, a roll-back, a callback); within the steps only the
    update moves them, and it keeps shard and weight equal."""
    self.strategy.run(self.refresh_here)

  def refresh_here(self) -> None:
    """`refresh` in a replica's context."""
    _assign_each(tf.distribute.get_replica_context(),
                 [s.value for s in self.shards],
                 [self._slice(v.value, s.shape[0])
                  for v, s in zip(self.variables, self.shards)])

  def apply(self, grads) -> None:
    """One update from this replica's gradients (replica context)."""
    self.optimizer.apply(grads, self.shards)
    # A constraint (a max-norm) reads the whole weight, after the update
    # as Keras applies it: its shard takes the constrained slice back, as
    # a replicated weight would be.
    whole = [w if v.constraint is None else v.constraint(w)
             for v, w in zip(self.variables, self.gathered(self.shards))]
    bound = [i for i, v in enumerate(self.variables) if v.constraint]
    _assign_each(tf.distribute.get_replica_context(),
                 [v.value for v in self.variables]
                 + [self.shards[i].value for i in bound],
                 whole + [self._slice(whole[i], self.shards[i].shape[0])
                          for i in bound])

  def gathered(self, parts) -> list[tf.Tensor]:
    """Every weight whole from its shard-like variable in `parts` (the
    shards, the averages; replica context): a collective per weight of
    ALONE bytes or more (its [N, k] back is the weight), one per dtype for
    the rest end to end (its [N, sum of k] cut by a split: a strided copy,
    1.4 ms of a 21 ms step for 670,000 float32 on 2 CPUs, where a
    collective costs about 0.05 ms)."""
    whole = [None] * len(parts)
    groups = {}
    for i, part in enumerate(parts):
      weight = self.variables[i]
      alone = (weight.shape.num_elements() * tf.as_dtype(weight.dtype).size
               >= ALONE)
      groups.setdefault(i if alone else part.dtype, []).append(i)
    for indices in groups.values():
      rows = [parts[i].shape[0] for i in indices]
      flat = tf.concat([tf.convert_to_tensor(parts[i].value)
                        for i in indices], axis=0)
      table = tf.reshape(compat.all_gather(flat), [self.replicas, sum(rows)])
      pieces = tf.split(table, rows, axis=1) if len(rows) > 1 else [table]
      for i, piece in zip(indices, pieces):
        whole[i] = _unpadded(piece, self.variables[i])
    return whole

  # --- Checkpoints ----------------------------------------------------------

  def whole(self, part, weight) -> tf.Tensor:
    """A shard-like variable `part` of `weight` (a slot, an average)
    gathered from the replicas, in its weight's shape (cross-replica
    context; under multi-worker a collective: every worker saves)."""
    if compat.in_multi_worker_mode(self.strategy):  # a collective
      flat = self.strategy.gather(part.value, axis=0)
    else:  # the devices' parts, in replica order (no retraced gather)
      flat = tf.concat(self.strategy.experimental_local_results(part.value),
                       axis=0)
    return tf.reshape(flat[:weight.shape.num_elements()], weight.shape)

  def set_parts(self, part, value: tf.Tensor) -> None:
    """Sets each replica's component of `part` from its whole `value`."""
    parts = self.strategy.experimental_distribute_values_from_function(
        lambda context: self._slice(value, part.shape[0],
                                    context.replica_id_in_sync_group))
    self.strategy.extended.update(part.value, lambda s, x: s.assign(x),
                                  args=(parts,))

  def saved_whole(self, part, weight):
    """A checkpoint item saving `part` as `weight`'s whole variable
    (restoring sets the parts): the layout of a replicated run."""
    return compat.saved_as_variable(lambda: self.whole(part, weight),
                                    lambda value: self.set_parts(part, value))

  def checkpointed(self):
    """What a checkpoint holds for the optimizer: a replicated run's."""
    return compat.optimizer_layout(self._inner, self.variables, {
        id(v): self.saved_whole(v, self.variables[self._slot_of[id(v)]])
        for v in self._inner.variables if id(v) in self._slot_of})

  def average(self, decay: float) -> "ShardedAverage":
    """optimizer.ema_decay's average, sharded as the slots are."""
    return ShardedAverage(self, decay)


class ShardedAverage:
  """ema.WeightAverage's average, 1/N per replica: each replica averages
  its weight shards; the swap for eval and export gathers the averages
  into the weights, then the shards back."""

  def __init__(self, sharded: Sharded, decay: float):
    """Call inside `strategy.scope()`; starts from the current weights."""
    self.sharded, self.decay = sharded, decay
    self.averages = [sharded.shard_of(v, "ema") for v in sharded.variables]
    for average, v in zip(self.averages, sharded.variables):
      sharded.set_parts(average, v.value)
    run = sharded.strategy.run
    self._swap_in = tf.function(lambda: run(self._gathered_in, args=(True,)),
                                autograph=False)
    self._swap_out = tf.function(lambda: run(self._gathered_in,
                                             args=(False,)), autograph=False)

  def update(self) -> None:
    """One step of the average (in replica context, after the update)."""
    ema.step([a.value for a in self.averages],
             [s.value for s in self.sharded.shards], self.decay)

  def checkpointed(self) -> list:
    """The averages whole, as ema.WeightAverage's are saved."""
    return [self.sharded.saved_whole(a, v)
            for a, v in zip(self.averages, self.sharded.variables)]

  @contextlib.contextmanager
  def swapped(self):
    """The weights hold the average inside, their own values after."""
    self._swap_in()
    try:
      yield
    finally:
      self._swap_out()

  def _gathered_in(self, averages: bool) -> None:
    """The weights from the averages (first the shards from the weights:
    they hold the trained values meanwhile), or back from the shards."""
    sharded, context = self.sharded, tf.distribute.get_replica_context()
    if averages:
      sharded.refresh_here()
    _assign_each(context, [v.value for v in sharded.variables],
                 sharded.gathered(self.averages if averages else
                                  sharded.shards))


def part_of(tensor, rows: int, replicas: int, replica) -> tf.Tensor:
  """Replica `replica`'s `rows` elements of `tensor`, flattened and padded
  to `replicas` x `rows`; the id may be a tensor (a TPU's: fixed shapes,
  XLA compiles it)."""
  flat = tf.reshape(tf.convert_to_tensor(tensor), [-1])
  if rows * replicas > flat.shape[0]:
    flat = tf.pad(flat, [[0, rows * replicas - flat.shape[0]]])
  return tf.slice(flat, [tf.cast(replica, tf.int32) * rows], [rows])


def _sparse_slice(grad: tf.IndexedSlices, rows: int) -> tf.IndexedSlices:
  """This replica's `rows` elements of a sparse gradient (an Embedding's),
  still sparse: an entry per element of each of its rows (duplicate rows
  kept apart), those in the slice. Keras' sparse update is not that of
  the dense sum (Adam's second moment takes sum(g_i^2), not (sum g_i)^2)."""
  # Elements per row (after the all-reduce its static shape is unknown).
  width = tf.cast(tf.reduce_prod(grad.dense_shape[1:]), tf.int32)
  flat = tf.reshape(tf.cast(grad.indices, tf.int32)[:, None] * width
                    + tf.range(width), [-1])
  replica = tf.distribute.get_replica_context().replica_id_in_sync_group
  local = flat - tf.cast(replica, tf.int32) * rows
  inside = tf.where((local >= 0) & (local < rows))[:, 0]
  return tf.IndexedSlices(tf.gather(tf.reshape(grad.values, [-1]), inside),
                          tf.gather(local, inside), tf.constant([rows]))


def _unpadded(piece, weight) -> tf.Tensor:
  """`weight`'s value from its [N, k] gathered parts (padding dropped)."""
  size = weight.shape.num_elements()
  if piece.shape.num_elements() > size:
    piece = tf.reshape(piece, [-1])[:size]
  return tf.reshape(piece, weight.shape)


def _assign_each(context, variables, values) -> None:
  """Each replica's `values` into its component of `variables` (the
  strategy's update path: one merge call)."""
  def update(strategy, values):
    for variable, value in zip(variables, values):
      strategy.extended.update(variable, lambda v, x: v.assign(x),
                               args=(value,), group=False)
  context.merge_call(update, args=(values,))


class Replicated:
  """The optimizer as Keras builds it: its slots whole on every replica."""

  def __init__(self, variables, optimizer):
    self.variables, self.optimizer = list(variables), optimizer
    optimizer.build(self.variables)

  def refresh(self) -> None:
    """Nothing: the weights are the optimizer's variables."""

  def apply(self, grads) -> None:
    self.optimizer.apply_gradients(zip(grads, self.variables))

  def average(self, decay: float) -> ema.WeightAverage:
    """optimizer.ema_decay's average, whole on every replica."""
    return ema.WeightAverage(self.variables, decay)

  def checkpointed(self):
    """The inner optimizer under loss scaling (the slots' owner)."""
    return getattr(self.optimizer, "inner_optimizer", self.optimizer)


def updater(optimizer, variables, strategy: tf.distribute.Strategy, *,
            shard: bool):
  """`optimizer` built for `variables` (in the strategy's scope): Sharded
  (distribution.shard_optimizer on 2+ replicas; on one the weights are
  the shards) or Replicated; `.apply(grads)` in a replica step."""
  why = shard and refusal(strategy, getattr(optimizer, "inner_optimizer",
                                            optimizer))
  if why:
    raise ConfigError(why)
  if shard and strategy.num_replicas_in_sync > 1:
    return Sharded(variables, optimizer, strategy)
  return Replicated(variables, optimizer)
