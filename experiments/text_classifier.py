"""Variable-length text classification with a few padded lengths (buckets).

Synopsis::

    # Full IMDB reviews (Keras' imdb.npz, found or downloaded as in
    # experiments/imdb_lstm.py), up to 512 tokens in buckets of 64:
    python -m looper.main --config=experiments/text_classifier.py \
        --workdir=/tmp/text

    # Every review padded to max_len instead: one shape, 8x the tokens.
    python -m looper.main --config=experiments/text_classifier.py \
        --workdir=/tmp/text_padded --config.data.bucket=0

    # From Python:
    from experiments import text_classifier
    config = text_classifier.get_config()
    model = text_classifier.model_fn(config)   # int32 [batch, any length]
    reviews = text_classifier.dataset_fn(config, "test[:1000]")

Reviews vary from a few tokens to thousands. Padding them all to `max_len`
wastes most of the compute; a different length per batch would compile a
new XLA program per batch. In between, each batch runs at a multiple of
`data.bucket` tokens (64, 128, ..., 512): at most max_len / bucket shapes,
each compiled once.

`dataset_fn` yields each review as it is (its first `max_len` tokens);
looper groups each epoch's shuffled reviews by length bucket and pads
each global batch to its bucket, exactly on any replica count (see
`train_dataset` in looper/data/buckets.py). The model masks the padding (id 0):
its output does not depend on how much padding a review got.
"""

import keras
import ml_collections
import numpy as np
import tensorflow as tf

from experiments import common
from experiments import imdb_lstm
from looper import config as lc
from looper.data import datasets


def get_config() -> ml_collections.ConfigDict:
  """Returns the config: about 2.5 epochs of batch 64 over 25,000 reviews."""
  # 25,000 test reviews are 50 batches of 500, each padded to its longest
  # review rounded up to a multiple of data.bucket (nearly always max_len).
  c = common.config(model_fn, dataset_fn, steps=1000, batch_size=64,
                    steps_per_loop=100, eval_every=500, eval_batch_size=500,
                    optimizer="adam", learning_rate=1e-3, schedule="cosine")

  c.data.train_split = "train"
  c.data.eval_split = "test"
  # Batches run at a multiple of this many tokens: max_len / bucket shapes.
  # 0: every review padded to max_len (one shape).
  c.data.bucket = 64
  # The whole train split in the buffer: a full shuffle per epoch, as
  # imdb_lstm's array mode gets (a smaller buffer keeps the file's order in
  # the large).
  c.data.shuffle_buffer = 25_000
  # The same imdb.npz as experiments/imdb_lstm.py, in the same cache.
  datasets.add_fields(c, cache_dir=imdb_lstm.DEFAULT_CACHE_DIR,
                      url=imdb_lstm.DEFAULT_URL,
                      file_hash=imdb_lstm.DEFAULT_HASH)

  # Keep the num_words most frequent words; rarer ones become OOV ids.
  c.model.num_words = lc.whole(20_000)
  # Reviews keep their first max_len tokens; a multiple of data.bucket, so
  # the longest bucket is exactly max_len.
  c.model.max_len = lc.whole(512)
  c.model.embed_dim = lc.whole(64)
  # Trigram filters over the embeddings, max- and mean-pooled.
  c.model.filters = lc.whole(128)
  return c


def model_fn(config: ml_collections.ConfigDict) -> keras.Model:
  """Returns token ids [batch, any length] -> 2 logits, padding masked.

  Embedding -> Conv1D(3) -> ReLU, then the max and the mean over the real
  tokens only -> Dense(2). Padding (id 0) embeds to zeros, so the
  convolution sees at a review's end what it sees at the sequence's end,
  and the pooling skips it: a review's logits do not depend on its padding.

  Raises:
    ConfigError: see `check_config`.
  """
  check_config(config)
  tokens = keras.Input(shape=(None,), dtype="int32", name="tokens")
  mask = keras.ops.expand_dims(keras.ops.not_equal(tokens, imdb_lstm.PAD), -1)
  x = keras.layers.Embedding(config.model.num_words,
                             config.model.embed_dim)(tokens)
  x = keras.ops.where(mask, x, 0)
  x = keras.layers.Conv1D(config.model.filters, 3, padding="same",
                          activation="relu")(x)
  # After the ReLU every value is >= 0, so zeros at the padding leave the
  # max of a review's positions unchanged (and an all-padding example,
  # looper's eval filler, gets zeros rather than -inf).
  x = keras.ops.where(mask, x, 0)
  count = keras.ops.maximum(keras.ops.sum(keras.ops.cast(mask, x.dtype), 1), 1)
  pooled = keras.layers.Concatenate()([keras.ops.max(x, 1),
                                       keras.ops.sum(x, 1) / count])
  # float32 even under a mixed precision policy: the loss needs it.
  logits = keras.layers.Dense(2, dtype="float32", name="logits")(pooled)
  return keras.Model(tokens, logits, name="text_classifier")


def check_config(config: ml_collections.ConfigDict) -> None:
  """What `lc.validate` cannot see in one declared field: num_words
  against the reserved ids, max_len against data.bucket.

  Raises:
    ConfigError: num_words keeps no word after the reserved ids; max_len
      is not a multiple of data.bucket (the longest batches would be
      padded past max_len).
  """
  model = config.model
  imdb_lstm.check_num_words(model)
  bucket = config.data.bucket
  if bucket and model.max_len % bucket:
    raise lc.ConfigError(
        f"config.model.max_len={model.max_len} is not a multiple of"
        f" config.data.bucket={bucket}, so the longest batches would be"
        f" padded past it; set --config.model.max_len="
        f"{-(-model.max_len // bucket) * bucket}")


def dataset_fn(config: ml_collections.ConfigDict,
               split: str) -> tf.data.Dataset:
  """Returns `split`'s reviews, each of its own length (at most max_len).

  Args:
    config: reads `data.*`, `model.num_words` and `model.max_len`.
    split: 'train' or 'test' with an optional slice: 'train[:90%]'.

  Returns:
    A dataset of (tokens int32 [length], label int32), in the file's order;
    with data.bucket=0, every review padded at its end to [max_len].

  Raises:
    ConfigError: see `check_config`; a bad split, or a missing, corrupt or
      undownloadable file.
  """
  check_config(config)
  reviews, labels = imdb_lstm.load_split(config, split)
  ids = [x[:config.model.max_len]
         for x in imdb_lstm.encode(reviews, config.model.num_words)]
  tokens = tf.RaggedTensor.from_row_lengths(
      np.concatenate(ids), [len(x) for x in ids])
  if not config.data.bucket:
    tokens = tokens.to_tensor(imdb_lstm.PAD,
                              shape=[None, config.model.max_len])
  # Sliced from a RaggedTensor, each row is a RaggedTensor of ragged rank
  # 0; the map makes it the plain int32 tensor looper's padding needs.
  return tf.data.Dataset.from_tensor_slices((tokens, labels)).map(
      lambda x, y: (x, y))
