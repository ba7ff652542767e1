"""Keras' own random layers under looper's contracts: exact resume, and one
loss curve on any replica count.

Synopsis::

    model = keras.Sequential([..., keras.layers.Dropout(0.3), ...])
    random = randomness.adopt(model, rows=16)  # once, after it is built;
                        # rows: a replica's examples per micro-batch
    random.states       # every random state: tf.train.Checkpoint(random=...)
    random.unreachable  # ["layer 'lstm_cell' (LSTMCell)", ...]: not invariant
    random.note()       # the one line train, describe and check print

Keras 3 keeps a random layer's position in its stream in a SeedGenerator,
which is not a TensorFlow trackable: `tf.train.Checkpoint(model=model)`
saves none of it, and a resumed run replays the draws of step 1 (measured:
an MLP with Dropout(0.3) resumed at step 20 drifted by up to 0.11 in the
loss). `adopt` returns every such state of the model, nested layers
included (a MultiHeadAttention's dropout, an LSTM's cell), for the
Trainer's checkpoint.

Under tf.distribute every replica draws the same numbers (the state is one
mirrored variable), so 2 replicas drop the same units of different
examples and the curve depends on the replica count. The layers of
PER_EXAMPLE (each output row depends on its input row and its own noise
only) are made replica-invariant on the model as built, wherever they sit:
on R replicas each runs Keras' own `call` on its rows tiled R times (the
shape of the global batch) and keeps its own copy, so every replica draws
the global batch's noise from the same seed and the example at global
position i gets the noise row i, as on one device. On one replica nothing
changes: the draws are Keras' own. The cost is R times the layer's
elementwise work and memory on each replica (`tests.bench.random_layers`'
figure: docs/pages/benchmarks.md): cheap on a few replicas, a known cost on a
large TPU slice, as looper's own `looper.train.layers` (which draw the
global batch's noise only).

Random draws of other layers (an LSTM's `dropout=`, a layer of the user's
calling `keras.random` with its own SeedGenerator, a subclass of a table
layer: its `call` may not be per example) are resumed exactly too, but
draw the same on every replica: `unreachable` names them.
"""

import dataclasses

from absl import logging
import keras
import tensorflow as tf

from looper import keras_compat
from looper.train import layers as looper_layers

# Keras layers whose output row i is a function of input row i and noise
# row i alone (elementwise noise, or one draw per image); exact classes:
# a user's subclass may change `call`.
PER_EXAMPLE = (
    keras.layers.Dropout, keras.layers.SpatialDropout1D,
    keras.layers.SpatialDropout2D, keras.layers.SpatialDropout3D,
    keras.layers.GaussianNoise, keras.layers.GaussianDropout,
    keras.layers.AlphaDropout, keras.layers.RandomFlip,
)


@dataclasses.dataclass
class Random:
  """What `adopt` found in a model."""
  # The state variable of every SeedGenerator outside looper's own layers
  # (theirs are already attributes the checkpoint reaches), keyed by its
  # place in the model's layer order and its layer's class ('003_Dropout'):
  # a checkpoint item a changed model does not restore into silently.
  states: dict
  # 'layer NAME (Class)' for each layer drawing the same on every replica.
  unreachable: list[str]

  def note(self) -> str | None:
    """One line naming the layers the loss curve depends on the replica
    count through, or None."""
    if not self.unreachable:
      return None
    return (f"random draws looper cannot make replica-invariant:"
            f" {', '.join(self.unreachable)}; they draw the same numbers on"
            " every replica, so the loss curve depends on the replica count"
            " (resume stays exact). Use keras.layers.Dropout between layers"
            " instead of a recurrent layer's dropout=, or looper.train.layers")


def adopt(model: keras.Model, rows: int) -> Random:
  """Makes `model`'s PER_EXAMPLE layers replica-invariant (in place, once)
  and returns its random states and the layers it cannot reach. `rows`:
  the examples of one replica's micro-batch (a layer's first axis when it
  holds examples)."""
  states, unreachable = {}, []
  for layer in keras_compat.sublayers(model):
    if isinstance(layer, looper_layers.GlobalBatchNoise):
      continue  # invariant by construction, its state already tracked
    generators = keras_compat.seed_generators(layer)
    for generator in generators:
      states[f"{len(states):03d}_{type(layer).__name__}"] = generator.state
    if type(layer) in PER_EXAMPLE:  # pylint: disable=unidiomatic-typecheck
      if not getattr(layer, "_looper_invariant", False):
        layer.call = _tiled(layer.call, rows, layer.name)
        layer._looper_invariant = True  # pylint: disable=protected-access
    elif generators:
      unreachable.append(f"layer {layer.name!r} ({type(layer).__name__})")
  return Random(states, unreachable)


def _tiled(call, rows: int, name: str):
  """`call` (a PER_EXAMPLE layer's) run in training on this replica's rows
  tiled to the global batch; this replica's copy is kept (see module). A
  tensor whose first axis is not the replica's `rows` examples (dropout on
  a kernel, a time-major sequence) is not tiled: Keras' own draw, said
  once."""
  said = []

  def replica_invariant_call(inputs, *args, training=False, **kwargs):
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync if context else 1
    if not training or replicas == 1:
      return call(inputs, *args, training=training, **kwargs)
    if inputs.shape[0] != rows:  # static: known when traced
      if not said:  # each replica traces it
        said.append(name)
        logging.warning(
            "Layer %r draws on a tensor of shape %s, whose first axis is"
            " not a replica's %d examples: its draws are the same on every"
            " replica, so the loss curve depends on the replica count.",
            name, inputs.shape.as_list(), rows)
      return call(inputs, *args, training=training, **kwargs)
    tiled = tf.tile(inputs, [replicas] + [1] * (inputs.shape.rank - 1))
    outputs = call(tiled, *args, training=training, **kwargs)
    # A static-size gather at a (possibly runtime: TPU) replica id, so the
    # output keeps the input's static shape under XLA.
    copies = tf.reshape(outputs, tf.concat([[replicas], tf.shape(inputs)], 0))
    mine = tf.gather(copies, tf.cast(context.replica_id_in_sync_group,
                                     tf.int32))
    return tf.ensure_shape(mine, inputs.shape)

  return replica_invariant_call
