"""A decoder-only transformer over bytes (nanoGPT's GPT-2 shape) in Keras.

Synopsis::

    from experiments.text import data, model
    net = model.build(config.model, vocab=data.VOCAB, seed=config.seed)
    logits = net(ids)          # int32 [batch, context] -> [.., context, 256]

Per block: x + MHA(LN(x)) under a causal mask, then x + MLP(LN(x)) with a
4 * width GELU hidden layer; then a final LayerNorm and the output
projection: the token embedding transposed (`TiedEmbedding`, as GPT-2 and
nanoGPT) or a Dense of its own. Positions are a learned vector each
(`PositionEmbedding`). keras-hub ships both layers (`ReversibleEmbedding`,
`PositionEmbedding`); these are the few lines looper needs without it.
"""

import keras
import ml_collections

from looper.train import layers

# GPT-2's initializer scale for every kernel and embedding.
_INIT_STDDEV = 0.02
# GPT-2's LayerNorm epsilon (Keras' default, 1e-3, is for conv nets).
_LN_EPSILON = 1e-5


def _init():
  # A new instance per layer: one unseeded instance called twice returns the
  # same values (Keras warns), so two layers would start identical.
  return keras.initializers.RandomNormal(stddev=_INIT_STDDEV)


@keras.saving.register_keras_serializable(package="lm")
class TiedEmbedding(keras.layers.Embedding):
  """The token embedding E [vocab, width], also the output projection.

  `layer(ids)` embeds; `layer(h, reverse=True)` returns the logits h @ E^T,
  computed in float32 whatever the dtype policy (the softmax and the loss
  need it; bfloat16 logits would round to ~3 significant digits). Called
  twice in the functional model, the layer and its one variable are shared.
  """

  def call(self, inputs, reverse=False):
    if not reverse:
      return super().call(inputs)
    # Embedding sets autocast=False: self.embeddings is the float32 variable.
    table = keras.ops.cast(self.embeddings, "float32")
    return keras.ops.matmul(keras.ops.cast(inputs, "float32"),
                            keras.ops.transpose(table))

  def compute_output_spec(self, inputs, reverse=False):
    if not reverse:
      return super().compute_output_spec(inputs)
    return keras.KerasTensor((*inputs.shape[:-1], self.input_dim),
                             dtype="float32")


@keras.saving.register_keras_serializable(package="lm")
class PositionEmbedding(keras.layers.Layer):
  """Adds a learned vector per position: x [batch, context, width] + P."""

  def __init__(self, context: int, **kwargs):
    super().__init__(**kwargs)
    self.context = context

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        shape=(self.context, input_shape[-1]), initializer=_init(),
        name="embeddings")

  def call(self, inputs):
    return inputs + keras.ops.cast(self.embeddings, inputs.dtype)

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    return {**super().get_config(), "context": self.context}


def build(m: ml_collections.ConfigDict, *, vocab: int,
          seed: int) -> keras.Model:
  """Returns ids int32 [batch, context] -> next-id logits [batch, context,
  vocab] (float32): pre-LayerNorm causal transformer blocks (module doc).

  Args:
    m: the sizes, already checked: `layers`, `heads`, `width` (a multiple
      of heads), `context`, `dropout`, `attention_dropout`, `tied`.
    vocab: how many ids (256 bytes).
    seed: the dropouts' seeds derive from it (the run's config.seed).

  Parameters, with V = vocab, W = width, L = layers, T = context:
  V W + T W + L (12 W^2 + 13 W) + 2 W, plus V W when not tied (no output
  bias, as nanoGPT).
  """
  dropouts = iter(range(1, 2 * m.layers + 2))

  def dropout(x):
    if not m.dropout:
      return x
    # A seed per layer: the same seed would drop the same units everywhere.
    return layers.Dropout(m.dropout, seed=seed * 1000 + next(dropouts))(x)

  ids = keras.Input(shape=(m.context,), dtype="int32", name="bytes")
  embedding = TiedEmbedding(vocab, m.width, embeddings_initializer=_init(),
                            name="token_embedding")
  x = PositionEmbedding(m.context, name="position_embedding")(embedding(ids))
  x = dropout(x)
  for i in range(m.layers):
    h = keras.layers.LayerNormalization(epsilon=_LN_EPSILON,
                                        name=f"block{i}_ln1")(x)
    h = keras.layers.MultiHeadAttention(
        m.heads, key_dim=m.width // m.heads, dropout=m.attention_dropout,
        kernel_initializer=_init(), seed=seed * 1000 + 100 + i,
        name=f"block{i}_attention")(h, h, use_causal_mask=True)
    x = x + dropout(h)
    h = keras.layers.LayerNormalization(epsilon=_LN_EPSILON,
                                        name=f"block{i}_ln2")(x)
    h = keras.layers.Dense(4 * m.width, activation="gelu",
                           kernel_initializer=_init(),
                           name=f"block{i}_mlp_in")(h)
    h = keras.layers.Dense(m.width, kernel_initializer=_init(),
                           name=f"block{i}_mlp_out")(h)
    x = x + dropout(h)
  x = keras.layers.LayerNormalization(epsilon=_LN_EPSILON,
                                      name="final_norm")(x)
  if m.tied:
    logits = embedding(x, reverse=True)
  else:
    # float32 even under a mixed policy, as the tied projection.
    logits = keras.layers.Dense(vocab, use_bias=False, dtype="float32",
                                kernel_initializer=_init(),
                                name="logits")(x)
  return keras.Model(ids, logits, name="byte_lm")
