"""A decoder-only transformer over bytes (nanoGPT's GPT-2 shape) in Keras.

Synopsis::

    from experiments.text import data, model
    net = model.build(config.model, vocab=data.VOCAB, seed=config.seed)
    logits = net(ids)          # int32 [batch, context] -> [.., context, 256]

    # The same weights one position at a time, keys and values cached:
    decode = model.Decoder(net)
    cache = decode.empty(batch=1)
    logits, cache = decode(ids, 0, cache)     # a window from position 0
    logits, cache = decode(ids[:, 5:6], 5, cache)   # then byte 5 alone

Per block (`Block`): x + MHA(LN(x)) under a causal mask, then x + MLP(LN(x))
with a 4 * width GELU hidden layer; then a final LayerNorm and the output
projection: the token embedding transposed (`TiedEmbedding`, as GPT-2 and
nanoGPT) or a Dense of its own. Positions are a learned vector each
(`PositionEmbedding`), so no position can exceed the context: a cache is
valid for one window's positions only (experiments/text/sample.py rebuilds
it when the text outgrows the window). keras-hub ships these layers
(`ReversibleEmbedding`, `PositionEmbedding`, `CachedMultiHeadAttention`);
these are the few lines looper needs without it.

`model.remat` recomputes each block's activations in the backward pass
instead of keeping them (see `Block`).
"""

import keras
import ml_collections
import tensorflow as tf

from looper.train import layers

# GPT-2's LayerNorm epsilon (Keras' default, 1e-3, is for conv nets).
_LN_EPSILON = 1e-5
# `model.init` -> (kernel, embedding) initializer classes. keras: Keras'
# layer defaults, what a plain Keras model starts from (glorot_uniform
# kernels, U(-0.05, 0.05) embeddings); gpt2: N(0, 0.02) for both, GPT-2's
# and nanoGPT's. The benchmarks page's LM runs measure the difference.
INITS = {
    "keras": (keras.initializers.GlorotUniform,
              lambda: keras.initializers.RandomUniform(-0.05, 0.05)),
    "gpt2": (lambda: keras.initializers.RandomNormal(stddev=0.02),) * 2,
}


def _init(kind: str, embedding: bool = False):
  # A new instance per layer: one unseeded instance called twice returns the
  # same values (Keras warns), so two layers would start identical.
  return INITS[kind][embedding]()


def _norm(name: str) -> keras.layers.LayerNormalization:
  return keras.layers.LayerNormalization(epsilon=_LN_EPSILON, name=name)


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
  """Adds a learned vector per position: x [batch, n, width] + P[start:
  start + n] (start: the position of x[:, 0]; the model's window is
  n = context from 0, the decoder's a byte anywhere in it)."""

  def __init__(self, context: int, init: str = "keras", **kwargs):
    super().__init__(**kwargs)
    self.context, self.init = context, init

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        shape=(self.context, input_shape[-1]),
        initializer=_init(self.init, embedding=True), name="embeddings")

  def call(self, inputs, start=0):
    table = keras.ops.slice(self.embeddings, (start, 0),
                            (inputs.shape[1], inputs.shape[2]))
    return inputs + keras.ops.cast(table, inputs.dtype)

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    return {**super().get_config(), "context": self.context,
            "init": self.init}


@keras.saving.register_keras_serializable(package="lm")
class Block(keras.layers.Layer):
  """One transformer block: x + MHA(LN(x)), then x + MLP(LN(x)).

  With `remat`, a train step keeps only the block's input for the backward
  pass and runs the block again there (`keras.remat`, on TensorFlow
  `tf.recompute_grad`): activation memory of one block instead of all,
  for about one more forward pass of compute. The dropouts' random state
  (the block's only non-trainable variables) is reset to its value at the
  start of the block before each run, so the recomputation draws the masks
  the forward pass drew: with or without remat, the same gradients.

  Args:
    heads, width: attention heads and the residual stream's width.
    dropout: on each residual branch (looper's replica-invariant Dropout).
    attention_dropout: Keras' own, inside MultiHeadAttention (replica-
      invariant and resumed: looper.train.randomness).
    seeds: (attention, first branch, second branch) dropout seeds.
    remat: recompute in the backward pass (above).
    init: the kernels' initializer, a key of INITS.
  """

  def __init__(self, heads: int, width: int, *, dropout: float = 0.0,
               attention_dropout: float = 0.0, seeds=(None, None, None),
               remat: bool = False, init: str = "keras", **kwargs):
    super().__init__(**kwargs)
    self.heads, self.width, self.remat, self.init = heads, width, remat, init
    self.dropout, self.attention_dropout = dropout, attention_dropout
    self.seeds = tuple(seeds)
    self.ln1 = _norm("ln1")
    self.attention = keras.layers.MultiHeadAttention(
        heads, key_dim=width // heads, dropout=attention_dropout,
        kernel_initializer=_init(init), seed=seeds[0], name="attention")
    # Keras seeds the attention's projections when it is built (its
    # initializer cloned per projection, each clone drawing a seed): built
    # now, before the MLP's initializers draw theirs, the seeds follow the
    # order of the computation, attention then MLP.
    with keras.name_scope(self.name):  # its variables' paths: blockN/...
      self.attention.build((None, None, width), (None, None, width))
    self.ln2 = _norm("ln2")
    self.mlp_in = keras.layers.Dense(4 * width, activation="gelu",
                                     kernel_initializer=_init(init),
                                     name="mlp_in")
    self.mlp_out = keras.layers.Dense(width, kernel_initializer=_init(init),
                                      name="mlp_out")
    self.drops = [layers.Dropout(dropout, seed=s, name=f"dropout{i}")
                  for i, s in enumerate(seeds[1:])] if dropout else []

  def build(self, input_shape):
    self.ln1.build(input_shape)
    self.ln2.build(input_shape)
    self.mlp_in.build(input_shape)
    self.mlp_out.build((*input_shape[:-1], 4 * self.width))

  def call(self, x, training=False):
    if not (self.remat and training):
      return self._forward(x, training)
    states = self.non_trainable_variables
    # Read now (a copy: `value` is the variable itself, read when used).
    start = [keras.ops.copy(v.value) for v in states]

    def replay(x):
      for v, s in zip(states, start):
        v.assign(s)
      return self._forward(x, training)

    # `training` through the closure: a custom gradient takes no keywords
    # inside a tf.function.
    return keras.remat(replay)(x)

  def _forward(self, x, training):
    h = self.ln1(x)
    h = self.attention(h, h, use_causal_mask=True, training=training)
    x = x + self._drop(0, h, training)
    h = self.mlp_out(self.mlp_in(self.ln2(x)))
    return x + self._drop(1, h, training)

  def _drop(self, i, h, training):
    return self.drops[i](h, training=training) if self.drops else h

  def cached(self, x, cache, start):
    """The block at positions start.. of x [batch, n, width] (inference),
    attending to the cache's keys and values [2, batch, context, heads,
    key_dim] of the positions before, and writing x's there; returns (y,
    the cache)."""
    a = self.attention
    h = self.ln1(x)
    fresh = keras.ops.stack([a.key_dense(h), a.value_dense(h)])
    cache = keras.ops.slice_update(cache, (0, 0, start, 0, 0), fresh)
    # Query i (position start + i) sees the positions <= start + i: the
    # causal mask; the cache beyond is stale or zero, and masked.
    n, context = x.shape[1], cache.shape[2]
    seen = (keras.ops.arange(context)[None, :] <=
            start + keras.ops.arange(n)[:, None])
    h = keras.ops.dot_product_attention(
        a.query_dense(h), cache[0], cache[1], mask=seen[None, None],
        scale=1 / (self.width // self.heads)**0.5)
    x = x + a.output_dense(h)
    return x + self.mlp_out(self.mlp_in(self.ln2(x))), cache

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    return {**super().get_config(), "heads": self.heads,
            "width": self.width, "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "seeds": self.seeds, "remat": self.remat, "init": self.init}


def build(m: ml_collections.ConfigDict, *, vocab: int,
          seed: int) -> keras.Model:
  """Returns ids int32 [batch, context] -> next-id logits [batch, context,
  vocab] (float32): pre-LayerNorm causal transformer blocks (module doc).

  Args:
    m: the sizes, already checked: `layers`, `heads`, `width` (a multiple
      of heads), `context`, `dropout`, `attention_dropout`, `tied`, and
      `remat` (see `Block`), `init` (a key of INITS).
    vocab: how many ids (256 bytes).
    seed: the dropouts' seeds derive from it (the run's config.seed).

  Parameters, with V = vocab, W = width, L = layers, T = context:
  V W + T W + L (12 W^2 + 13 W) + 2 W, plus V W when not tied (no output
  bias, as nanoGPT).
  """
  ids = keras.Input(shape=(m.context,), dtype="int32", name="bytes")
  embedding = TiedEmbedding(vocab, m.width,
                            embeddings_initializer=_init(m.init, True),
                            name="token_embedding")
  x = PositionEmbedding(m.context, init=m.init,
                        name="position_embedding")(embedding(ids))
  if m.dropout:
    x = layers.Dropout(m.dropout, seed=seed * 1000 + 1)(x)
  for i in range(m.layers):
    # A seed per dropout: the same seed would drop the same units everywhere.
    x = Block(m.heads, m.width, dropout=m.dropout,
              attention_dropout=m.attention_dropout,
              seeds=(seed * 1000 + 100 + i, seed * 1000 + 2 + 2 * i,
                     seed * 1000 + 3 + 2 * i),
              remat=m.remat, init=m.init, name=f"block{i}")(x)
  x = _norm("final_norm")(x)
  if m.tied:
    logits = embedding(x, reverse=True)
  else:
    # float32 even under a mixed policy, as the tied projection.
    logits = keras.layers.Dense(vocab, use_bias=False, dtype="float32",
                                kernel_initializer=_init(m.init),
                                name="logits")(x)
  return keras.Model(ids, logits, name="byte_lm")


class Decoder:
  """`build`'s model through a cache of each block's keys and values.

  `decoder(ids, start, cache)` runs ids int32 [batch, n] at positions
  start..start + n - 1 (start + n <= context) and returns (float32 logits
  [batch, n, vocab], the cache with those positions written). Positions
  before `start` must be in the cache: fill a window with n = context from
  0 (its padding after the real bytes is masked from them, and overwritten
  later), then one byte at a time. Two traced graphs (n = context, n = 1)
  serve any text.
  """

  def __init__(self, net: keras.Model):
    names = [layer.name for layer in net.layers]
    self.embedding = net.get_layer("token_embedding")
    self.position = net.get_layer("position_embedding")
    self.blocks = [l for l in net.layers if isinstance(l, Block)]
    self.norm = net.get_layer("final_norm")
    self.logits = net.get_layer("logits") if "logits" in names else None
    self.context = self.position.context
    self._run = tf.function(self._step)

  def empty(self, batch: int) -> tf.Tensor:
    """A cache of zeros [layers, 2, batch, context, heads, key_dim]."""
    b = self.blocks[0]
    return tf.zeros(
        [len(self.blocks), 2, batch, self.context, b.heads,
         b.width // b.heads], b.attention.compute_dtype)

  def __call__(self, ids, start, cache):
    return self._run(tf.convert_to_tensor(ids, tf.int32),
                     tf.constant(start, tf.int32), cache)

  def _step(self, ids, start, cache):
    x = self.position(self.embedding(ids), start=start)
    caches = []
    for block, layer_cache in zip(self.blocks, tf.unstack(cache)):
      x, layer_cache = block.cached(x, layer_cache, start)
      caches.append(layer_cache)
    x = self.norm(x)
    logits = (self.logits(x) if self.logits else
              self.embedding(x, reverse=True))
    return keras.ops.cast(logits, "float32"), tf.stack(caches)
