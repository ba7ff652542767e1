"""Sampling the LM through its key/value cache (experiments/text/model.py's
Decoder, experiments/text/sample.py).

The references are the model's own forward pass over whole windows: the
cached logits at every position of a window filled piece by piece, and,
for `generate`, a loop written here that runs the model on each byte's
window (the window rule of sample.py's doc, spelled out again) and takes
the argmax. Cached and whole-window generation must give the same bytes,
greedy and seeded top-k, for prompts shorter and longer than the context
and generations several contexts long; an export (a SavedModel with
looper's serving signature) samples the same bytes with TensorFlow alone.
A small random model: a few seconds on 2 CPU cores.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from experiments import lm
from experiments.text import model as model_lib
from experiments.text import sample
from looper.options import precision
from looper.workdir import export
from tests.fixtures.configs import configured

T = 8  # the tests' context
SMALL = {"model.layers": 2, "model.heads": 2, "model.width": 16,
         "model.context": T}


def _model(policy="float32", **fields):
  keras.utils.set_random_seed(6)
  with precision.policy(policy):
    return lm.model_fn(configured(lm.get_config(), {**SMALL, **fields}))


@pytest.fixture(scope="module")
def net():
  return _model()


@pytest.fixture(scope="module")
def whole(net):
  """The model's forward pass over a whole window, as an export serves it
  (traced: an eager Keras call costs ~50 ms a byte on a loaded CPU)."""
  return tf.function(lambda x: net(x, training=False))


@pytest.mark.slow  # over 2 s: out of the fast lane
@pytest.mark.parametrize("policy,tied,atol", [
    ("float32", True, 1e-5), ("float32", False, 1e-5),
    ("mixed_bfloat16", True, 5e-3)])
def test_cached_logits_are_the_whole_windows(policy, tied, atol):
  model = _model(policy, **{"model.tied": tied})
  ids = np.random.default_rng(0).integers(0, 256, (2, T)).astype(np.int32)
  whole = model(ids).numpy()
  decode = model_lib.Decoder(model)
  cache = decode.empty(batch=2)
  assert cache.shape == (2, 2, 2, T, 2, 8)  # layers, k/v, batch, T, heads
  window = np.zeros_like(ids)  # the first 3 bytes, padded with 0
  window[:, :3] = ids[:, :3]
  logits, cache = decode(window, 0, cache)
  got = [logits.numpy()[:, :3]]
  for p in range(3, T):
    logits, cache = decode(ids[:, p:p + 1], p, cache)
    got.append(logits.numpy())
  assert logits.dtype == tf.float32
  np.testing.assert_allclose(np.concatenate(got, axis=1), whole, atol=atol)
  # One graph per shape: a window and a byte, whatever the position.
  assert decode._run.experimental_get_tracing_count() == 2  # pylint: disable=protected-access


def _reference_greedy(model, prompt: bytes, num: int, keep: int) -> bytes:
  """Each byte the argmax of the model over its window: the window grows
  from the prompt's last T bytes and restarts from its last `keep` when it
  would exceed T; the rest of the row 0xff (the causal mask hides it)."""
  text = list(prompt)
  start = max(0, len(text) - T)
  for _ in range(num):
    if len(text) - start > T:
      start = len(text) - keep
    x = np.full((1, T), 255, np.int32)
    x[0, :len(text) - start] = text[start:]
    text.append(int(np.argmax(model(x)[0, len(text) - start - 1])))
  return bytes(text[len(prompt):])


@pytest.mark.parametrize("keep", [None, 1, 5, T])
@pytest.mark.parametrize("prompt", [b"ab", b"a prompt longer than T"])
def test_greedy_generation_is_the_reference_with_and_without_cache(
    net, whole, prompt, keep):
  want = _reference_greedy(whole, prompt, 3 * T, keep or T // 2)
  for logits_fn in (net, whole):
    assert sample.generate(logits_fn, prompt, 3 * T, context=T,
                           temperature=0, keep=keep) == want


@pytest.mark.parametrize("prompt", [b"", b"ab", b"a prompt longer than T"])
def test_seeded_top_k_is_the_same_with_and_without_cache(net, whole,
                                                          prompt):
  def draw(seed, logits_fn):
    return sample.generate(logits_fn, prompt, 3 * T, context=T,
                           temperature=0.9, top_k=40, seed=seed)
  cached = draw(1, net)
  assert len(cached) == 3 * T and cached == draw(1, whole)
  assert draw(2, net) == draw(2, whole) != cached


def test_a_byte_costs_one_position_and_a_full_window_one_window(
    net, monkeypatch):
  """keep=T//2=4 after a 2-byte prompt: a window for the first byte, then
  one position each while the window grows to T (6 bytes); then a window
  of the last 4 bytes and 4 single positions, again and again: 20 bytes
  are 4 windows and 16 positions."""
  shapes = []
  call = model_lib.Decoder.__call__

  def spy(self, ids, start, cache):
    shapes.append((np.shape(ids)[1], start))
    return call(self, ids, start, cache)
  monkeypatch.setattr(model_lib.Decoder, "__call__", spy)
  sample.generate(net, b"ab", 20, context=T, temperature=0)
  windows = [i for i, (n, _) in enumerate(shapes) if n == T]
  assert len(shapes) == 20 and windows == [0, 7, 12, 17]
  assert all(at == 0 for n, at in shapes if n == T)
  assert [at for _, at in shapes[1:7]] == [2, 3, 4, 5, 6, 7]
  assert [at for _, at in shapes[8:12]] == [4, 5, 6, 7]


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_an_export_samples_the_bytes_of_the_cached_model(net, tmp_path):
  serving = tf.function(
      lambda inputs: {"logits": net(inputs, training=False)},
      input_signature=[export.input_signature(tf.TensorSpec([T], tf.int32))])
  tf.saved_model.save(net, str(tmp_path / "export"),
                      signatures={export.SIGNATURE: serving})
  serve = tf.saved_model.load(str(tmp_path / "export")).signatures[
      export.SIGNATURE]
  from_export = sample.generate(
      lambda x: serve(inputs=tf.constant(x))["logits"], b"The q", 3 * T,
      context=T, temperature=0.7, top_k=20, seed=3)
  assert from_export == sample.generate(net, b"The q", 3 * T, context=T,
                                        temperature=0.7, top_k=20, seed=3)


@pytest.mark.parametrize("kwargs,message", [
    ({"keep": 0}, "generate: keep=0 must be in 1..8 (context) or None"),
    ({"keep": T + 1}, "generate: keep=9 must be in 1..8 (context) or None"),
    ({"context": 16}, "generate: context=16 is not the model's (8); pass"
     " context=8"),
])
def test_bad_arguments_are_one_line(net, kwargs, message):
  with pytest.raises(ValueError) as e:
    sample.generate(net, b"x", 1, **{"context": T, **kwargs})
  assert str(e.value) == message
