"""A byte-level decoder-only transformer language model (nanoGPT's baby GPT).

Synopsis::

    # TinyShakespeare, downloaded once into ~/.cache/looper/tinyshakespeare
    # (checked against its published sha256), split 90/10 by bytes:
    python -m looper.main --config=experiments/lm.py --workdir=/tmp/lm

    # Offline on this machine: the Python docs beside this repo, faq/ held out.
    python -m looper.main --config=experiments/lm.py --workdir=/tmp/lm \
        --config.data.dir=../shared/data/text/pydocs

    # Your own folder of text files, its last 10% of bytes held out:
    ... --config.data.dir=/data/books --config.data.eval_glob=''

    # From Python (a notebook, a test):
    from experiments import lm
    config = lm.get_config()
    config.data.dir = "../shared/data/text/pydocs"
    model = lm.model_fn(config)              # int32 [batch, 64] -> [.., 256]
    inputs, labels, weights = lm.dataset_fn(config, "eval")
    print(lm.generate(model, b"The ", 200, context=config.model.context,
                      temperature=0.8, top_k=20, seed=1).decode(
                          errors="replace"))

    # Sampling from an export (--mode=export, or export.at_end=True), with
    # TensorFlow alone:
    serve = tf.saved_model.load("/tmp/lm/export/2000").signatures[
        "serving_default"]
    lm.generate(lambda x: serve(inputs=tf.constant(x))["logits"], b"The ",
                200, context=64)

The model reads bytes (256 ids, no tokenizer) and predicts the next byte
at every position: inputs int32 [batch, context] -> logits [batch, context,
256]. Each example is one window of the split's byte stream with its
labels, the same window shifted by one byte; the loss is the mean over real
bytes (`loss_normalization="weights"`) and `bits_per_byte` is that mean in
bits, on eval over every byte of the eval split exactly once.

The corpus, when `data.dir` is set (never a download there): the files
ending in .txt, .text, .rst, .md or .markdown below it, but hidden files
and LICENSE*/LICENCE*/COPYING* (for pydocs: exactly the 71 files of the
docs). `data.eval_glob` (relative to data.dir; a folder stands for every
text file below it) picks the eval files, every other one is train: whole
files apart. `data.eval_glob=''` holds out the last `data.eval_fraction`
of the bytes instead, which is also how TinyShakespeare (no data.dir) is
split, as nanoGPT does. A split is its files in sorted order, joined with
one NUL byte (which UTF-8 text never holds: GPT-2's <|endoftext|>).

Windows of a split's bytes b (n of them), context T:
* train: inputs b[s:s+T], labels b[s+1:s+T+1] for s = 0, S, 2S, ...,
  S = `model.stride` (0: T // 2): each byte is learned with short and long
  context. Array mode holds every window: stride 1 (nanoGPT's random
  offsets) would take 1.3 GB on pydocs, T // 2 takes 40 MB.
* eval: non-overlapping, the last window padded with weight 0: every byte
  but the first is a target exactly once (the weights sum to n - 1), so
  `bits_per_byte` is the whole split's.

`generate` samples with a fixed [1, context] window (one XLA or serving
shape): a short prompt is padded on the right, which the causal mask makes
irrelevant, and the logits are read at its last real byte.
"""

import glob
import math
import os
from typing import Callable

import keras
import ml_collections
import numpy as np

from experiments import common
from looper import config as lc
from looper import datasets
from looper import layers

# The split names dataset_fn knows (data.train_split, data.eval_split).
SPLITS = ("train", "eval")
DEFAULT_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
               "data/tinyshakespeare/input.txt")
# TensorFlow Datasets' recorded sha256 of that file (1,115,394 bytes,
# tensorflow_datasets/datasets/tiny_shakespeare/checksums.tsv).
DEFAULT_HASH = (
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")
DEFAULT_CACHE_DIR = "~/.cache/looper/tinyshakespeare"
SHAKESPEARE_FILE = "input.txt"
# What a file's name ends with for it to be read as text (see module doc).
TEXT_SUFFIXES = (".txt", ".text", ".rst", ".md", ".markdown")
# Files of a corpus that are not its text (matched on the upper-case name).
NOT_TEXT_PREFIXES = ("LICENSE", "LICENCE", "COPYING")
# Between two files of a split; also the right padding of eval windows and
# prompts (weight 0, or after the causal mask's horizon).
SEPARATOR = b"\0"
VOCAB = 256  # bytes
# GPT-2's initializer scale for every kernel and embedding.
_INIT_STDDEV = 0.02
# GPT-2's LayerNorm epsilon (Keras' default, 1e-3, is for conv nets).
_LN_EPSILON = 1e-5
_LN2 = math.log(2.0)


def get_config() -> ml_collections.ConfigDict:
  """Returns nanoGPT's baby GPT: 4 layers of 128, context 64, ~3 minutes."""
  # nanoGPT's README run on a laptop CPU is batch 12 for 2000 iterations
  # (24,000 windows), AdamW at 1e-3 with 100 warmup steps and a cosine
  # decay (to 0 here; nanoGPT stops at 1e-4). Here batch 64, the smallest
  # that splits into 8 windows per core on 8 TPU cores (looper check), for
  # 800 steps (51,200 windows, one epoch of pydocs at stride 32): 5 steps/s
  # on 2 CPU cores (batch 12: 16/s), so the same ~3 minutes.
  # Eval: 256 windows (32 per core on 8) of 64 bytes; pydocs' faq/ (192 KB)
  # is 12 batches.
  c = common.config(model_fn, dataset_fn, steps=800, batch_size=64,
                    steps_per_loop=100, eval_every=400, eval_batch_size=256,
                    optimizer="adamw", learning_rate=1e-3, schedule="cosine")
  c.optimizer.warmup_steps = 100
  # nanoGPT's weight decay and gradient clipping (its train.py defaults).
  c.optimizer.weight_decay = 0.1
  c.optimizer.clip_global_norm = 1.0
  # The loss is the mean over real bytes (weight 1) of the global batch,
  # not over windows: padding never dilutes it.
  c.loss_normalization = "weights"
  c.metrics = (bits_per_byte, "accuracy")

  c.data.train_split = "train"
  c.data.eval_split = "eval"
  # With data.dir: the eval files, a glob relative to it ('' : hold out the
  # last eval_fraction of the bytes). faq/ is pydocs' suggested eval split.
  c.data.eval_glob = "faq/*"
  # nanoGPT's 90/10 split of one text by bytes (TinyShakespeare, or any
  # data.dir with eval_glob='').
  c.data.eval_fraction = 0.1
  datasets.add_fields(c, cache_dir=DEFAULT_CACHE_DIR, url=DEFAULT_URL,
                      file_hash=DEFAULT_HASH)

  # Transformer blocks, attention heads, and the residual stream's width
  # (heads of width // heads = 32): nanoGPT's baby GPT, 0.83M parameters.
  c.model.layers = 4
  c.model.heads = 4
  c.model.width = 128
  # Bytes a window holds: the most context a prediction sees.
  c.model.context = 64
  # Bytes between the starts of two train windows; 0: context // 2 (see
  # the module doc for the trade-off).
  c.model.stride = 0
  # Dropout on the embeddings and each residual branch (looper's: the same
  # curve on any replica count). The baby GPT uses none at 2000 steps.
  c.model.dropout = 0.0
  # Dropout on the attention probabilities (Keras' own inside
  # MultiHeadAttention, so > 0 makes the curve depend on the replica count).
  c.model.attention_dropout = 0.0
  # The output projection is the token embedding transposed (logits =
  # h @ E^T), as in GPT-2 and nanoGPT; False: a Dense(256) of its own.
  c.model.tied = True
  return c


# --- Model ------------------------------------------------------------------


def _whole(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def check_config(config: ml_collections.ConfigDict) -> None:
  """The model's sizes: whole numbers >= 1 (stride >= 0), width a multiple
  of heads, dropouts in [0, 1). Raises ConfigError naming the field."""
  model = config.model
  for field, low in (("layers", 1), ("heads", 1), ("width", 1),
                     ("context", 1), ("stride", 0)):
    if not _whole(model[field]) or model[field] < low:
      raise lc.ConfigError(
          f"config.model.{field}={model[field]!r} must be a whole number >="
          f" {low}; set --config.model.{field}")
  if model.width % model.heads:
    raise lc.ConfigError(
        f"config.model.width={model.width} does not split into"
        f" model.heads={model.heads} heads of equal width; set"
        f" --config.model.width to a multiple of {model.heads}")
  for field in ("dropout", "attention_dropout"):
    if not isinstance(model[field], (int, float)) or not 0 <= model[field] < 1:
      raise lc.ConfigError(
          f"config.model.{field}={model[field]!r} must be in [0, 1); set"
          f" --config.model.{field}")


def _init():
  # A new instance per layer: one unseeded instance called twice returns the
  # same values (Keras warns), so two layers would start identical.
  return keras.initializers.RandomNormal(stddev=_INIT_STDDEV)


@keras.saving.register_keras_serializable(package="lm")
class TiedEmbedding(keras.layers.Embedding):
  """The token embedding E [256, width], also the output projection.

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


def model_fn(config: ml_collections.ConfigDict) -> keras.Model:
  """Returns byte ids int32 [batch, context] -> next-byte logits [batch,
  context, 256] (float32): pre-LayerNorm causal transformer blocks.

  Per block: x + MHA(LN(x)) under a causal mask, then x + MLP(LN(x)) with a
  4 * width GELU hidden layer; then a final LayerNorm and the output
  projection (the embedding transposed when model.tied). Parameters, with
  W = width, L = layers, T = context: 256 W + T W + L (12 W^2 + 13 W) + 2 W,
  plus 256 W when not tied (no output bias, as nanoGPT).

  Raises:
    ConfigError: see `check_config`.
  """
  check_config(config)
  m = config.model
  dropouts = iter(range(1, 2 * m.layers + 2))

  def dropout(x):
    if not m.dropout:
      return x
    # A seed per layer: the same seed would drop the same units everywhere.
    return layers.Dropout(m.dropout,
                          seed=config.seed * 1000 + next(dropouts))(x)

  ids = keras.Input(shape=(m.context,), dtype="int32", name="bytes")
  embedding = TiedEmbedding(VOCAB, m.width, embeddings_initializer=_init(),
                            name="token_embedding")
  x = PositionEmbedding(m.context, name="position_embedding")(embedding(ids))
  x = dropout(x)
  for i in range(m.layers):
    h = keras.layers.LayerNormalization(epsilon=_LN_EPSILON,
                                        name=f"block{i}_ln1")(x)
    h = keras.layers.MultiHeadAttention(
        m.heads, key_dim=m.width // m.heads, dropout=m.attention_dropout,
        kernel_initializer=_init(), seed=config.seed * 1000 + 100 + i,
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
    logits = keras.layers.Dense(VOCAB, use_bias=False, dtype="float32",
                                kernel_initializer=_init(),
                                name="logits")(x)
  return keras.Model(ids, logits, name="byte_lm")


# --- Metric -----------------------------------------------------------------


class BitsPerByte(keras.metrics.Mean):
  """The weighted mean next-byte cross-entropy, in bits (nats / ln 2)."""

  def __init__(self, name: str = "bits_per_byte", dtype=None):
    super().__init__(name=name, dtype=dtype)

  def update_state(self, y_true, y_pred, sample_weight=None):
    """Labels int [batch, T], logits [batch, T, 256]; sample_weight
    [batch, T] (a byte's weight), [batch] (a window's) or None."""
    nats = keras.losses.sparse_categorical_crossentropy(
        y_true, keras.ops.cast(y_pred, "float32"), from_logits=True)
    return super().update_state(nats / _LN2, sample_weight=sample_weight)


def bits_per_byte() -> BitsPerByte:
  """The metric factory for `config.metrics`."""
  return BitsPerByte()


# --- Data -------------------------------------------------------------------


def text_files(directory: str) -> list[str]:
  """The text files below `directory` (see the module doc), as sorted
  paths relative to it with '/' separators."""
  found = []
  for folder, subfolders, names in os.walk(directory):
    subfolders[:] = [d for d in subfolders if not d.startswith(".")]
    for name in names:
      if (name.lower().endswith(TEXT_SUFFIXES) and not name.startswith(".")
          and not name.upper().startswith(NOT_TEXT_PREFIXES)):
        path = os.path.relpath(os.path.join(folder, name), directory)
        found.append(path.replace(os.sep, "/"))
  return sorted(found)


def _eval_files(directory: str, pattern: str, files: list[str]) -> set[str]:
  """The text `files` the glob `pattern` selects (a matched folder: every
  text file below it)."""
  chosen = set()
  for match in glob.glob(pattern, root_dir=directory, recursive=True):
    match = os.path.normpath(match).replace(os.sep, "/")
    if os.path.isdir(os.path.join(directory, match)):
      prefix = "" if match == "." else match + "/"
      chosen.update(f for f in files if f.startswith(prefix))
    elif match in files:
      chosen.add(match)
  return chosen


def _read(directory: str, files: list[str]) -> bytes:
  parts = []
  for name in files:
    with open(os.path.join(directory, name), "rb") as f:
      data = f.read()
    if SEPARATOR in data:
      raise lc.ConfigError(
          f"config.data.dir: {os.path.join(directory, name)} holds NUL bytes,"
          " so it is not UTF-8 text (UTF-16 or binary); convert it to UTF-8"
          " or move it out of --config.data.dir")
    parts.append(data)
  return SEPARATOR.join(parts)


def _by_fraction(data: ml_collections.ConfigDict, stream: bytes,
                 name: str) -> bytes:
  """nanoGPT's split: the first 1 - eval_fraction of the bytes train."""
  fraction = data.eval_fraction
  if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
    raise lc.ConfigError(
        f"config.data.eval_fraction={fraction!r} must be in (0, 1), e.g. 0.1;"
        " set --config.data.eval_fraction")
  cut = int(len(stream) * (1 - fraction))
  return stream[:cut] if name == "train" else stream[cut:]


def _shakespeare(directory: str) -> bytes | None:
  path = os.path.join(directory, SHAKESPEARE_FILE)
  if not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    return f.read()


def corpus(config: ml_collections.ConfigDict, name: str) -> bytes:
  """Split `name`'s byte stream ('train' or 'eval', no slice): its files
  joined by SEPARATOR, or its share of the bytes (see the module doc).

  Raises:
    ConfigError: no text files under data.dir, an eval_glob selecting no
      file or every file, a NUL byte in a file, a failed download.
  """
  if name not in SPLITS:
    raise lc.ConfigError(
        f"the text corpus has no split {name!r}; use"
        f" {' or '.join(repr(s) for s in SPLITS)} in --config.data.train_split"
        " / --config.data.eval_split")
  data = config.data
  if not data.get("dir"):
    stream = datasets.locate(data, "TinyShakespeare", _shakespeare,
                             expected=SHAKESPEARE_FILE)
    return _by_fraction(data, stream, name)

  directory = os.path.abspath(os.path.expanduser(data.dir))
  files = text_files(directory) if os.path.isdir(directory) else []
  if not files:
    missing = ("" if os.path.isdir(directory)
               else " (the directory does not exist)")
    raise lc.ConfigError(
        f"config.data.dir={data.dir!r} ({directory}) has no text files"
        f"{missing}: expected *{', *'.join(TEXT_SUFFIXES)} files; point"
        " --config.data.dir at the folder holding them")
  pattern = data.eval_glob
  if not pattern:
    return _by_fraction(data, _read(directory, files), name)
  if os.path.isabs(pattern):
    raise lc.ConfigError(
        f"config.data.eval_glob={pattern!r} must be relative to data.dir,"
        " e.g. 'faq/*'; set --config.data.eval_glob")
  held_out = _eval_files(directory, pattern, files)
  if not held_out or len(held_out) == len(files):
    what = "no" if not held_out else f"all {len(files)}"
    raise lc.ConfigError(
        f"config.data.eval_glob={pattern!r} selects {what} of the text files"
        f" under data.dir ({directory}); set --config.data.eval_glob to the"
        " eval files' glob, e.g. 'faq/*' ('': the last data.eval_fraction"
        " of the bytes)")
  chosen = sorted(held_out) if name == "eval" else [
      f for f in files if f not in held_out]
  return _read(directory, chosen)


def _windows(stream: bytes, context: int, stride: int, pad: bool):
  """(inputs, labels, weights) of the windows of `stream` (module doc)."""
  # One spare byte: the labels of a window are its inputs shifted by one;
  # padded, every byte but the first is a target of exactly one window.
  size = context + 1
  b = np.frombuffer(stream, np.uint8)
  if pad:
    count = -(-(len(b) - 1) // stride)
    b = np.concatenate([b, np.zeros((count - 1) * stride + size - len(b),
                                    np.uint8)])
    real = np.arange(count)[:, None] * stride + np.arange(1, size) < len(
        stream)
  rows = np.lib.stride_tricks.sliding_window_view(b, size)[::stride]
  if pad:
    rows = rows[:count]
  else:
    real = np.ones((len(rows), context), bool)
  return (rows[:, :-1].astype(np.int32), rows[:, 1:].astype(np.int32),
          real.astype(np.float32))


def dataset_fn(config: ml_collections.ConfigDict, split: str):
  """Returns `split`'s windows as arrays, one row per example.

  Args:
    config: reads `data.*` and `model.context`, `model.stride`.
    split: 'train' or 'eval' with an optional slice of the windows:
      'train[:50%]'.

  Returns:
    (inputs, labels, weights): int32 [N, context] bytes, int32 [N, context]
    next bytes, float32 [N, context] 1.0 for a real target, 0.0 for eval's
    padding. looper shuffles, batches and shards them.

  Raises:
    ConfigError: a bad split or model field, a split too short for one
      window, or what `corpus` raises.
  """
  check_config(config)
  field, name = common.split_name(config, split, SPLITS,
                                  dataset="the text corpus",
                                  sliced="train[:50%]")
  stream = corpus(config, name)
  context = config.model.context
  need = context + 1 if name == "train" else 2
  if len(stream) < need:
    raise lc.ConfigError(
        f"config.{field}={split!r}: the {name} split has {len(stream)} bytes,"
        f" fewer than the {need} of one window (model.context={context});"
        " add text to it or lower --config.model.context")
  if name == "train":
    arrays = _windows(stream, context, config.model.stride or
                      max(1, context // 2), pad=False)
  else:
    arrays = _windows(stream, context, context, pad=True)
  _, rows = lc.split_slice(split, len(arrays[0]), field=field)
  return tuple(a[rows] for a in arrays)


# --- Sampling ---------------------------------------------------------------


def generate(logits_fn: Callable, prompt: bytes, num_bytes: int, *,
             context: int, temperature: float = 1.0, top_k: int | None = None,
             seed: int = 0) -> bytes:
  """Returns `num_bytes` bytes sampled after `prompt`, one at a time.

  Args:
    logits_fn: int32 [1, context] -> logits [1, context, 256]: the Keras
      model, or an export's `lambda x: serve(inputs=tf.constant(x))[
      "logits"]` (module doc).
    prompt: the text to continue; only its last `context` bytes are seen.
      Empty: b"\\0", the separator before a document.
    num_bytes: how many bytes to generate (>= 0).
    context: the model's window, config.model.context.
    temperature: the logits are divided by it; 0: the most likely byte.
    top_k: sample among the k most likely bytes only (None: all 256).
    seed: the sampling's seed; the same seed gives the same bytes.

  Raises:
    ValueError: an argument out of range (named).
  """
  if not isinstance(prompt, (bytes, bytearray)):
    raise TypeError(f"generate: prompt must be bytes, got"
                    f" {type(prompt).__name__}; pass text.encode()")
  if not _whole(context) or context < 1:
    raise ValueError(f"generate: context={context!r} must be >= 1 (the"
                     " model's config.model.context)")
  if not _whole(num_bytes) or num_bytes < 0:
    raise ValueError(f"generate: num_bytes={num_bytes!r} must be >= 0")
  if not temperature >= 0:
    raise ValueError(f"generate: temperature={temperature!r} must be >= 0"
                     " (0: greedy)")
  if top_k is not None and (not _whole(top_k) or not 1 <= top_k <= VOCAB):
    raise ValueError(f"generate: top_k={top_k!r} must be in 1..{VOCAB} or"
                     " None")
  rng = np.random.default_rng(seed)
  text = bytearray(prompt or SEPARATOR)
  start = len(text)
  window = np.zeros((1, context), np.int32)
  for _ in range(num_bytes):
    seen = text[-context:]
    # Right-padded: one static shape; the causal mask hides the padding
    # from every real position.
    window[:] = 0
    window[0, :len(seen)] = np.frombuffer(bytes(seen), np.uint8)
    logits = np.asarray(logits_fn(window), np.float64)[0, len(seen) - 1]
    if temperature == 0:
      text.append(int(np.argmax(logits)))
      continue
    logits = logits / temperature
    if top_k is not None and top_k < VOCAB:
      kth = np.sort(logits)[-top_k]
      logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max())
    text.append(int(rng.choice(VOCAB, p=probs / probs.sum())))
  return bytes(text[start:])
