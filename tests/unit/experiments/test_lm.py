"""Tests of experiments/lm.py and its parts in experiments/text/: the
corpus and its windows, the causal model, its XLA compile, the
bits-per-byte metric, sampling, 40 steps with looper whose eval loss
and metrics are recomputed here over every eval byte, and a kill -9 at 2
replicas resumed bit for bit. tests/unit/experiments/test_lm_math.py trains
it against a plain TensorFlow loop.

The windows are checked against a reference built here with plain bytes
slicing over a folder of small text files written by the test; the real
corpus is the Python docs beside the repo (../shared/data/text/pydocs),
its sizes recomputed here from the files. The model is small and random:
what is tested is causality, shapes, parameter counts and that sampling
is the argmax loop it promises. Nothing leaves the machine (the download
test serves its file on 127.0.0.1). About 20 s on 2 CPU cores.
"""

import hashlib
import math
import re
import signal
import urllib.parse

import keras
import numpy as np
import pytest
import tensorflow as tf

from experiments import lm
from experiments.text import data
from experiments.text import metrics
from experiments.text import sample
from looper import config as lc
from looper import run
from looper.cli import tpu_check
from looper import workdir as workdir_lib
from looper.data import windows
from looper.measure import goodput
from looper.options import losses
from looper.options import precision
from tests.fixtures.checkpoints import restored_trainer
from tests.fixtures.configs import configured, run_here
from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import ROOT
from tests.fixtures.processes import popen_looper
from tests.fixtures.servers import loopback_server

PYDOCS = ROOT.parent / "shared" / "data" / "text" / "pydocs"
T = 8  # the tests' context

# The tests' small folder: path -> bytes. Text files by extension, in
# folders; the rest must not be read (the png even holds a NUL byte).
FILES = {
    "a.txt": b"Hello, world.\nA first train file.\n",
    "b/notes.md": b"# Notes\n\nMarkdown is text too.\n",
    "b/c/deep.rst": b"Deep ``rst`` file. " * 3,
    "faq/q1.txt": b"Q: why?\nA: because.\n",
    "faq/q2.rst.txt": b"A second faq file, long enough for two windows.\n",
    # Its length pads the last eval window (the eval bytes but the first
    # are not a multiple of T).
    "faq/sub/q3.md": b"nested eval.",
    "image.png": b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
    "b/table.csv": b"1,2,3\n",
    "LICENSE.txt": b"Permission is hereby granted...\n",
    ".hidden.txt": b"not part of the corpus\n",
}
TRAIN_FILES = ["a.txt", "b/c/deep.rst", "b/notes.md"]  # sorted by path
EVAL_FILES = ["faq/q1.txt", "faq/q2.rst.txt", "faq/sub/q3.md"]
# Small enough to build and compile in a second or two.
TINY = {"model.layers": 2, "model.heads": 2, "model.width": 16,
        "model.context": T}


def _write_corpus(directory):
  for name, content in FILES.items():
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
  return directory


@pytest.fixture
def folder(tmp_path):
  return _write_corpus(tmp_path / "corpus")


def _config(data_dir="", **fields):
  return configured(lm.get_config(), {**TINY, "data.dir": str(data_dir),
                                      **fields})


def _stream(names, files=FILES):
  return b"\0".join(files[n] for n in names)


def _reference_train(stream: bytes, context: int, stride: int):
  """Every full window starting at 0, stride, 2 stride, ... (byte slices);
  no weights (every label is real)."""
  inputs, labels = [], []
  s = 0
  while s + context + 1 <= len(stream):
    inputs.append(list(stream[s:s + context]))
    labels.append(list(stream[s + 1:s + context + 1]))
    s += stride
  return np.array(inputs), np.array(labels)


def _reference_eval(stream: bytes, context: int):
  """Non-overlapping windows, the last padded with 0 bytes of weight 0."""
  inputs, labels, weights = [], [], []
  for s in range(0, len(stream) - 1, context):
    x, y = stream[s:s + context], stream[s + 1:s + context + 1]
    inputs.append(list(x) + [0] * (context - len(x)))
    labels.append(list(y) + [0] * (context - len(y)))
    weights.append([1.0] * len(y) + [0.0] * (context - len(y)))
  return np.array(inputs), np.array(labels), np.array(weights)


def _assert_windows(got, want):
  """`got`: virtual windows of one stream, held once; as arrays `want`."""
  assert len(got) == len(want)
  assert all(isinstance(g, windows.Windows) for g in got)
  assert [g.dtype for g in got] == [np.int32, np.int32, np.float32][:len(got)]
  assert got[0].stream is got[1].stream  # inputs and labels share the bytes
  for g, w in zip(got, want):
    assert g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g), w)


# --- Data -------------------------------------------------------------------


def test_text_files_by_extension_without_license_or_hidden(folder):
  assert data.text_files(str(folder)) == sorted(TRAIN_FILES + EVAL_FILES)


@pytest.mark.parametrize("stride", [0, 1, 3])
def test_windows_match_a_bytes_reference(folder, stride):
  c = _config(folder, **{"model.stride": stride})
  train = _stream(TRAIN_FILES)
  _assert_windows(lm.dataset_fn(c, "train"),
                  _reference_train(train, T, stride or T // 2))
  # eval_glob 'faq/*' matched faq/sub, a folder: its files are eval too.
  evaluation = _stream(EVAL_FILES)
  got = lm.dataset_fn(c, "eval")
  _assert_windows(got, _reference_eval(evaluation, T))
  inputs, labels, weights = map(np.asarray, got)
  # Every eval byte but the first is a target exactly once, in order.
  assert weights.sum() == len(evaluation) - 1
  assert bytes(labels[weights == 1].astype(np.uint8)) == evaluation[1:]
  assert len(inputs) == math.ceil((len(evaluation) - 1) / T)


def test_glob_picks_the_eval_files(folder):
  c = _config(folder, **{"data.eval_glob": "faq/q*.txt"})
  held_out = ["faq/q1.txt", "faq/q2.rst.txt"]
  rest = sorted(set(TRAIN_FILES + EVAL_FILES) - set(held_out))
  assert data.corpus(c.data, "eval") == _stream(held_out)
  assert data.corpus(c.data, "train") == _stream(rest)
  c = _config(folder, **{"data.eval_glob": "**/deep.rst"})
  assert data.corpus(c.data, "eval") == FILES["b/c/deep.rst"]


def test_empty_glob_holds_out_the_last_tenth_of_the_bytes(folder):
  c = _config(folder, **{"data.eval_glob": ""})
  everything = _stream(sorted(TRAIN_FILES + EVAL_FILES))
  cut = int(len(everything) * 0.9)
  assert data.corpus(c.data, "train") == everything[:cut]
  assert data.corpus(c.data, "eval") == everything[cut:]


def test_split_slices_select_windows(folder):
  c = _config(folder)
  inputs, labels = map(np.asarray, lm.dataset_fn(c, "train"))
  half = round(len(inputs) / 2)
  for got, whole in zip(lm.dataset_fn(c, "train[:50%]"), (inputs, labels)):
    np.testing.assert_array_equal(got, whole[:half])
  _, middle, _ = lm.dataset_fn(c, "eval[25%:75%]")
  _, labels, _ = map(np.asarray, lm.dataset_fn(c, "eval"))
  np.testing.assert_array_equal(
      middle, labels[round(len(labels) / 4):round(len(labels) * 3 / 4)])


@pytest.mark.parametrize("fields,split,names", [
    ({"data.eval_split": "valid"}, "valid", "config.data.eval_split='valid'"),
    ({"data.eval_glob": "nope/*"}, "eval", "config.data.eval_glob='nope/*'"),
    ({"data.eval_glob": "**/*"}, "train", "config.data.eval_glob='**/*'"),
    ({"model.width": 15}, "train", "config.model.width=15"),
    ({"model.context": 4096}, "train", "config.data.train_split='train'"),
    ({"model.init": "xavier"}, "train", "config.model.init='xavier'"),
])
def test_bad_fields_are_one_line_naming_the_field(folder, fields, split,
                                                   names):
  with pytest.raises(lc.ConfigError) as e:
    lm.dataset_fn(_config(folder, **fields), split)
  assert names in str(e.value) and "\n" not in str(e.value)


def test_model_sizes_are_declared_fields(folder):
  with pytest.raises(lc.ConfigError) as e:
    lc.validate(_config(folder, **{"model.stride": -1}))
  assert str(e.value) == ("config.model.stride=-1: must be a whole number"
                          " >= 0; set --config.model.stride")


def test_folders_without_text_and_files_with_nul_are_refused(tmp_path):
  (tmp_path / "x.png").write_bytes(b"\0")
  # Text in hidden folders only is no corpus either, however deep.
  (tmp_path / ".git" / "logs").mkdir(parents=True)
  (tmp_path / ".git" / "logs" / "HEAD.txt").write_bytes(b"0000 init\n")
  with pytest.raises(lc.ConfigError) as e:
    lm.dataset_fn(_config(tmp_path), "train")
  suffixes = ", ".join("*" + s for s in data.TEXT_SUFFIXES)
  assert str(e.value) == (
      f"config.data.dir={str(tmp_path)!r} ({tmp_path}) has no text files:"
      f" expected {suffixes} files; point --config.data.dir at the folder"
      " holding them")
  (tmp_path / "faq").mkdir()
  (tmp_path / "faq" / "utf16.txt").write_bytes("hi".encode("utf-16"))
  (tmp_path / "train.txt").write_bytes(b"plain text " * 10)
  with pytest.raises(lc.ConfigError, match="utf16.txt holds NUL bytes"):
    lm.dataset_fn(_config(tmp_path), "eval")


def test_without_data_dir_downloads_tinyshakespeare_split_90_10(tmp_path):
  """The default url's path served on 127.0.0.1: the default file_hash
  refuses a file that is not TinyShakespeare; with the file's own sha256
  it is downloaded, found by its name, split 90/10, then read from the
  cache."""
  path = urllib.parse.urlsplit(lm.get_config().data.url).path
  served = tmp_path / "served" / path.lstrip("/")
  served.parent.mkdir(parents=True)
  text = bytes(range(32, 127)) * 20
  served.write_bytes(text)
  cache = tmp_path / "cache"
  with loopback_server(tmp_path / "served") as base:
    c = _config("", **{"data.cache_dir": str(cache), "data.url": base + path})
    with pytest.raises(lc.ConfigError) as e:
      lm.dataset_fn(c, "eval")
    assert str(e.value).startswith(
        f"TinyShakespeare not found: looked in config.data.cache_dir"
        f" ({cache}) for {data.SHAKESPEARE_FILE}, and the download from"
        f" config.data.url={base + path!r} failed (")
    c.data.file_hash = hashlib.sha256(text).hexdigest()
    cut = int(len(text) * 0.9)
    _assert_windows(lm.dataset_fn(c, "eval"),
                    _reference_eval(text[cut:], T))
  # Now from the cache: no server.
  _assert_windows(lm.dataset_fn(c, "train"),
                  _reference_train(text[:cut], T, 1))  # every offset


# --- Model ------------------------------------------------------------------


def _hand_count(width, layers, context, tied):
  block = 12 * width * width + 13 * width  # attention 4W^2+4W, MLP 8W^2+5W,
  # two LayerNorms 4W
  return (256 * width + context * width + layers * block + 2 * width +
          (0 if tied else 256 * width))


@pytest.mark.parametrize("tied", [True, False])
def test_default_parameter_count_matches_the_formula(tied):
  c = lm.get_config()
  c.model.tied = tied
  model = lm.model_fn(c)
  m = c.model
  assert model.count_params() == _hand_count(m.width, m.layers, m.context,
                                             tied)
  assert (model.count_params() == 834_304) == tied  # nanoGPT's ~0.8M
  assert model.input_shape == (None, 64) and model.input.dtype == "int32"
  assert model.output_shape == (None, 64, 256)


@pytest.mark.parametrize("init", ["keras", "gpt2"])
def test_init_draws_every_kernel_and_embedding_as_named(init):
  keras.utils.set_random_seed(3)
  net = lm.model_fn(_config(**{"model.init": init, "model.tied": False,
                               "model.width": 64, "model.heads": 4}))
  drawn = {v.path: v.numpy() for v in net.trainable_variables
           if v.path.endswith(("kernel", "embeddings"))}
  # 2 blocks x (query, key, value, output, mlp_in, mlp_out), the output
  # Dense, the token and position tables.
  assert len(drawn) == 15
  for path, w in drawn.items():
    if init == "gpt2":
      assert abs(w.std() - 0.02) < 0.002 and abs(w.mean()) < 0.002, path
    elif path.endswith("embeddings"):  # U(-0.05, 0.05): std 0.05 / sqrt(3)
      assert np.abs(w).max() <= 0.05 and abs(w.std() - 0.0289) < 0.002, path
    else:  # glorot_uniform: U(+-sqrt(6 / (fan_in + fan_out))), fan_in the
      # dims the input contracts (heads x key_dim for attention_output)
      split = 2 if "attention_output" in path else 1
      limit = np.sqrt(6 / (np.prod(w.shape[:split]) +
                           np.prod(w.shape[split:])))
      assert 0.95 * limit < np.abs(w).max() <= limit, path


def test_model_is_causal():
  keras.utils.set_random_seed(1)
  model = lm.model_fn(_config())
  x = np.random.default_rng(0).integers(0, 256, (2, T)).astype(np.int32)
  base = model(x).numpy()
  assert base.shape == (2, T, 256) and base.dtype == np.float32
  for k in (0, 3, T - 1):
    changed = x.copy()
    changed[:, k] = (x[:, k] + 1) % 256
    out = model(changed).numpy()
    np.testing.assert_allclose(out[:, :k], base[:, :k], rtol=0, atol=1e-6)
    assert np.abs(out[:, k] - base[:, k]).max() > 1e-4  # it does see byte k


def test_tied_logits_are_the_embedding_transposed():
  keras.utils.set_random_seed(2)
  model = lm.model_fn(_config())
  x = np.arange(2 * T, dtype=np.int32).reshape(2, T)
  hidden = keras.Model(model.input, model.get_layer("final_norm").output)(x)
  table = model.get_layer("token_embedding").embeddings.numpy()
  np.testing.assert_allclose(model(x).numpy(), hidden.numpy() @ table.T,
                             rtol=1e-5, atol=1e-5)
  assert "logits" not in [l.name for l in model.layers]
  untied = lm.model_fn(_config(**{"model.tied": False}))
  assert untied.get_layer("logits").kernel.shape == (16, 256)


@pytest.mark.slow  # trains or compiles for seconds
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_forward_and_backward_compile_with_xla(policy):
  keras.utils.set_random_seed(3)
  with precision.policy(policy):
    # One block: a second compiles the same ops again.
    model = lm.model_fn(_config(**{"model.dropout": 0.1, "model.layers": 1}))
  loss_fn = losses.LOSSES["sparse_categorical_crossentropy"]

  @tf.function(jit_compile=True)
  def step(x, y, w):
    with tf.GradientTape() as tape:
      logits = tf.cast(model(x, training=True), tf.float32)
      loss = tf.reduce_sum(loss_fn(y, logits) * w) / tf.reduce_sum(w)
    return logits, loss, tape.gradient(loss, model.trainable_variables)

  x = np.random.default_rng(4).integers(0, 256, (3, T + 1)).astype(np.int32)
  logits, loss, grads = step(x[:, :-1], x[:, 1:], tf.ones((3, T)))
  assert logits.shape == (3, T, 256)
  assert model.output.dtype == "float32"  # the logits, under either policy
  assert all(v.dtype == "float32" for v in model.trainable_weights)
  # Random logits: the loss is near ln 256 nats.
  assert abs(float(loss) - math.log(256)) < 0.5
  assert all(g is not None and np.isfinite(g.numpy()).all() for g in grads)
  assert len(grads) == len(model.trainable_variables)
  # XLA compiled the whole step into one HLO module.
  hlo = step.experimental_get_compiler_ir(x[:, :-1], x[:, 1:],
                                          tf.ones((3, T)))(stage="hlo")
  assert hlo.startswith("HloModule")


# --- Metric -----------------------------------------------------------------


def test_bits_per_byte_is_the_weighted_cross_entropy_in_bits():
  rng = np.random.default_rng(5)
  logits = rng.normal(size=(3, 4, 256)).astype(np.float32) * 3
  labels = rng.integers(0, 256, (3, 4)).astype(np.int32)
  weights = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
  shifted = logits - logits.max(-1, keepdims=True)
  nats = (np.log(np.exp(shifted).sum(-1)) -
          np.take_along_axis(shifted, labels[..., None], -1)[..., 0])
  metric = metrics.bits_per_byte()
  assert metric.name == "bits_per_byte"
  metric.update_state(labels[:2], logits[:2], sample_weight=weights[:2])
  metric.update_state(labels[2:], logits[2:], sample_weight=weights[2:])
  want = (nats * weights).sum() / weights.sum() / math.log(2)
  np.testing.assert_allclose(float(metric.result()), want, rtol=1e-5)
  metric = metrics.bits_per_byte()
  metric.update_state(labels, logits)
  np.testing.assert_allclose(float(metric.result()),
                             nats.mean() / math.log(2), rtol=1e-5)


def test_get_config_validates():
  c = lm.get_config()
  assert lc.validate(c) is None  # raises on the first bad field
  # The run it validated is the module doc's: 2000 steps (not epochs) of a
  # 4x128 model at context 64, its loss the mean over real bytes.
  assert (c.train.steps, c.train.epochs) == (2000, 0)
  assert (c.model.layers, c.model.width, c.model.heads, c.model.context) == (
      4, 128, 4, 64)
  assert c.loss_normalization == "weights" and c.train.jit_compile
  # Its own sizes are among the fields validate checks: each refused at 0.
  for field in ("layers", "heads", "width", "context"):
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(configured(lm.get_config(), {f"model.{field}": 0}))
    assert str(e.value) == (f"config.model.{field}=0: must be a whole number"
                            f" >= 1; set --config.model.{field}")


# --- Sampling ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model():
  keras.utils.set_random_seed(6)
  return lm.model_fn(_config())


def _hand_greedy(model, prompt: bytes, num: int) -> bytes:
  """Argmax of the logits at the last byte, the window filled with 0xff
  after the prompt (any filler: the mask hides it)."""
  text = list(prompt)
  for _ in range(num):
    seen = text[-T:]
    x = np.full((1, T), 255, np.int32)
    x[0, :len(seen)] = seen
    text.append(int(np.argmax(model(x).numpy()[0, len(seen) - 1])))
  return bytes(text[len(prompt):])


@pytest.mark.parametrize("prompt", [b"ab", b"a prompt longer than T"])
def test_greedy_generation_is_the_argmax_loop(tiny_model, prompt):
  # keep=T: the window slides by one byte, as _hand_greedy's (generate's
  # default restarts a full window from its last T // 2 bytes).
  got = sample.generate(tiny_model, prompt, 12, context=T, temperature=0,
                        keep=T)
  assert got == _hand_greedy(tiny_model, prompt, 12)
  # top_k=1 samples only the most likely byte: greedy, whatever the seed.
  assert sample.generate(tiny_model, prompt, 12, context=T, top_k=1,
                         seed=9, keep=T) == got


@pytest.mark.slow  # trains or compiles for seconds
def test_sampling_is_deterministic_per_seed(tiny_model):
  def draw(seed, prompt=b"x" * 20):
    return sample.generate(tiny_model, prompt, 16, context=T,
                           temperature=1.0, top_k=50, seed=seed)
  assert draw(0) == draw(0)
  assert draw(0) != draw(1)  # 16 draws among 50 bytes: never equal
  assert len(sample.generate(tiny_model, b"", 5, context=T)) == 5
  with pytest.raises(ValueError, match="top_k=0"):
    sample.generate(tiny_model, b"x", 1, context=T, top_k=0)


# --- End to end -------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, workdir, logs) of 40 steps with looper on the small folder
  and more text, so the train split holds a few batches of windows."""
  folder = _write_corpus(tmp_path_factory.mktemp("lm") / "corpus")
  (folder / "more.txt").write_bytes(b"The quick brown fox. " * 60)
  c = _config(folder, **{  # one block: what is checked is no block's
      "model.layers": 1,
      "train.steps": 40, "train.batch_size": 8, "train.steps_per_loop": 20,
      "eval.every_steps": 0, "eval.batch_size": 4,
      "checkpoint.every_steps": 0, "optimizer.warmup_steps": 5})
  workdir = folder.parent / "run"
  return c, workdir, run.run(c, str(workdir), "train_and_eval")


@pytest.mark.slow  # trains or compiles for seconds
def test_eval_loss_is_the_mean_over_every_eval_byte(trained):
  """The eval loss, bits_per_byte and accuracy, recomputed here from the
  checkpoint over every eval window: each eval byte counted once, padding
  never (loss_normalization="weights")."""
  c, workdir, logs = trained
  assert logs["step"] == 40
  model = restored_trainer(c, workdir / "checkpoints" / "ckpt-40").model
  inputs, labels, weights = map(np.asarray, lm.dataset_fn(c, "eval"))
  logits = model(inputs).numpy().astype(np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  nats = (np.log(np.exp(shifted).sum(-1)) -
          np.take_along_axis(shifted, labels[..., None], -1)[..., 0])
  mean = (nats * weights).sum() / weights.sum()
  assert weights.sum() == len(_stream(EVAL_FILES)) - 1
  assert weights.min() == 0  # padding, which a mean over windows would count
  np.testing.assert_allclose(logs["eval"]["loss"], mean, rtol=1e-4)
  np.testing.assert_allclose(logs["eval"]["bits_per_byte"],
                             mean / math.log(2), rtol=1e-4)
  hits = (logits.argmax(-1) == labels) * weights
  np.testing.assert_allclose(logs["eval"]["accuracy"],
                             hits.sum() / weights.sum(), rtol=1e-6)
  assert logs["eval"]["loss"] < math.log(256)  # it learned something


@pytest.mark.slow  # trains or compiles for seconds
def test_looper_export_serves_the_trained_model(trained):
  c, workdir, _ = trained
  run.run(c, str(workdir), "export")
  serve = tf.saved_model.load(str(workdir / "export" / "40")).signatures[
      "serving_default"]
  model = restored_trainer(c, workdir / "checkpoints" / "ckpt-40").model
  x = np.arange(3 * T, dtype=np.int32).reshape(3, T)
  np.testing.assert_allclose(serve(inputs=tf.constant(x))["logits"],
                             model(x), rtol=1e-5, atol=1e-5)
  # generate() on the export, as the module doc shows, samples what it
  # samples on the Keras model.
  from_export = sample.generate(
      lambda x: serve(inputs=tf.constant(x))["logits"], b"The q", 10,
      context=T, temperature=0.7, seed=3)
  assert from_export == sample.generate(model, b"The q", 10, context=T,
                                        temperature=0.7, seed=3)


@pytest.mark.slow  # a process of 2 replicas, killed
def test_kill9_redoes_the_steps_since_the_checkpoint_bit_for_bit(tmp_path):
  """Windows at every offset, 2 replicas, mixed_bfloat16, 2 micro-batches
  per update: a run frozen past its last checkpoint and killed (kill -9),
  then rerun, recomputes the steps since that checkpoint exactly (weights,
  optimizer and the position in the virtual windows restored) and ends
  with every step once. The killed run's own events are the reference for
  the steps redone; the rerun reads the disk alone (here). Without XLA: the state
  restored, not the compiler (XLA's curve: test_lm_remat), and each
  process's compile was seconds. One block: a process of 2 traced 6 s
  longer, and the restored state is no block's."""
  folder = _write_corpus(tmp_path / "corpus")
  (folder / "more.txt").write_bytes(b"The quick brown fox. " * 60)
  workdir = tmp_path / "run"
  args = ("--config=experiments/lm.py", f"--config.data.dir={folder}",
          *(f"--config.{k}={v}"
            for k, v in {**TINY, "model.layers": 1}.items()),
          "--config.model.stride=1", "--config.train.precision=mixed_bfloat16",
          "--config.train.grad_accum_steps=2", "--config.train.steps=24",
          "--config.distribution.num_cpu_devices=2",
          "--config.train.steps_per_loop=4", "--config.train.batch_size=8",
          "--config.checkpoint.every_steps=8",
          "--config.optimizer.warmup_steps=5", "--mode=train",
          "--config.train.jit_compile=False", f"--workdir={workdir}")
  proc = popen_looper(*args)
  try:
    for line in proc.stderr:  # a loop's end between two saves: freeze
      if re.search(r"train step +(4|12|20)/24", line):
        proc.send_signal(signal.SIGSTOP)
        before = scalars(workdir / "train", "loss")
        saved = tf.train.latest_checkpoint(str(workdir / "checkpoints"))
        if saved and before and int(saved.rsplit("-", 1)[1]) < max(before):
          break
        proc.send_signal(signal.SIGCONT)
    else:
      pytest.fail("no loop ended past a checkpoint before the run did")
  finally:
    proc.kill()
    proc.wait(timeout=60)
  restored = int(saved.rsplit("-", 1)[1])
  run_here(*args)  # the rerun reads the disk alone: here, on 2 logical CPUs
  after = curve(workdir / "train")  # steps 1..24, each once
  redone = range(restored + 1, max(before) + 1)
  assert len(redone) >= 4
  np.testing.assert_array_equal([after[s - 1] for s in redone],
                                [before[s] for s in redone])
  _, resumed = goodput.read(workdir_lib.Workdir(str(workdir)))
  assert resumed["first_step"] == restored  # it did restart there


# --- The real corpus --------------------------------------------------------


@pytest.mark.skipif(not PYDOCS.is_dir(),
                    reason=f"the shared text corpus is not at {PYDOCS}")
def test_pydocs_splits_faq_for_eval():
  c = configured(lm.get_config(), {"data.dir": str(PYDOCS)})
  files = sorted(p.relative_to(PYDOCS).as_posix() for p in PYDOCS.rglob("*")
                 if p.is_file())
  assert "LICENSE.rst.txt" in files and len(files) == 72
  text = [f for f in files if f != "LICENSE.rst.txt"]
  held_out = [f for f in text if f.startswith("faq/")]
  assert len(held_out) == 9 and len(text) == 71
  size = lambda names: sum((PYDOCS / f).stat().st_size for f in names)
  eval_bytes = size(held_out) + len(held_out) - 1  # NULs between files
  train_bytes = size(text) - size(held_out) + len(text) - len(held_out) - 1

  inputs, labels, weights = map(np.asarray, lm.dataset_fn(c, "eval"))
  assert weights.sum() == eval_bytes - 1
  assert len(inputs) == math.ceil((eval_bytes - 1) / 64)
  first = (PYDOCS / held_out[0]).read_bytes()[:65]
  assert bytes(inputs[0].astype(np.uint8)) == first[:64]
  assert bytes(labels[0].astype(np.uint8)) == first[1:]

  # The default stride, 1: every offset, the train bytes alone in memory.
  inputs, labels = lm.dataset_fn(c, "train")
  assert len(inputs) == len(labels) == train_bytes - 64
  assert inputs.stream is labels.stream
  assert inputs.stream.nbytes == train_bytes
  assert bytes(np.asarray(inputs[:1])[0].astype(np.uint8)) == (
      PYDOCS / "extending/building.rst.txt").read_bytes()[:64]
  c.model.stride = 0  # context // 2
  inputs, labels = lm.dataset_fn(c, "train")
  assert len(inputs) == (train_bytes - 65) // 32 + 1


@pytest.mark.skipif(not PYDOCS.is_dir(),
                    reason=f"the shared text corpus is not at {PYDOCS}")
@pytest.mark.slow  # trains or compiles for seconds
def test_the_default_config_is_ready_for_8_tpu_cores():
  """`looper check`: static shapes, int32 labels, the attention's train
  step compiles with XLA; the batch, tuned for 2 CPU cores, is the one
  thing to change, and the check says to what."""
  assert tpu_check.check(configured(lm.get_config(),
                                    {"data.dir": str(PYDOCS)})) == [
      "config.train.batch_size=16 gives 2 examples per TPU core (8 cores); a"
      " core pads to a multiple of 8, so set --config.train.batch_size=64"
      " (the TPU guides use 128 per core: 1024)"]
