"""looper's language model against a plain TensorFlow loop: the same losses.

The plain loop, written here from the documents and nothing of looper's
training path: the LM's own Keras model (`lm.model_fn`, the thing trained,
not tested here) from the same seed; each global batch's windows cut from
the train bytes by hand slicing, in the order array mode documents
(looper/data/arrays.py: global batch k is stream positions [kB, (k+1)B),
position j is example perm_{j // N}(j % N), perm_e =
tf.random.experimental.index_shuffle with seed (config.seed, e); window
i starts at byte i * stride); the mean cross-entropy over every byte of the
batch; the global gradient clipped to norm 1 (tf.clip_by_global_norm);
AdamW written out (Kingma and Ba's update with epsilon-hat, as Keras
documents it, then the decoupled decay var -= lr * wd * var); the
learning rate of update k peak * k / W for k <= W, then
peak * (1 + cos(pi * (k - 1 - W) / (T - W))) / 2 (looper/options/optimizers.py's
documented schedule, cosine to 0). looper runs the LM's config shrunk (a
block of width 32, context 16, windows at every offset) for 30 updates of 8
windows (27 more than one epoch) on 1 replica, and on 2 replicas
accumulating 2 micro-batches per update (the session's logical CPUs); every
step's loss must match the plain loop's (rtol 1e-5; measured: 1e-7; the
plain loop without the decay moves them 3e-3, without the clip 5e-3).
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from experiments import lm
from tests.fixtures.configs import configured, run_here
from tests.fixtures.events import curve

STEPS, BATCH, WARMUP = 30, 8, 5
# Train text of 229 bytes: 213 windows of 17 at stride 1 (30 steps of 8 is
# 240: the run crosses into a second, reshuffled epoch); eval in faq/.
TEXT = {"train.txt": b"It was the best of times, it was the worst of times, "
                     b"it was the age of wisdom, it was the age of "
                     b"foolishness, it was the epoch of belief, it was the "
                     b"epoch of incredulity, it was the season of Light, it "
                     b"was the season of Darkness.",
        "faq/q.txt": b"Q: why bytes?\nA: no tokenizer.\n"}
FIELDS = {"model.layers": 1, "model.heads": 2, "model.width": 32,
          "model.context": 16, "model.stride": 1, "train.steps": STEPS,
          "train.batch_size": BATCH, "train.steps_per_loop": STEPS,
          "optimizer.warmup_steps": WARMUP, "eval.every_steps": 0,
          "checkpoint.every_steps": 0, "seed": 7,
          # The math, not the compiler: XLA's curve has its own test
          # (test_lm_remat) and the defaults' compile is seconds per run.
          "train.jit_compile": False}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  folder = tmp_path_factory.mktemp("lm_math") / "corpus"
  for name, text in TEXT.items():
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(text)
  return folder


def _flags(folder):
  return ["--config=experiments/lm.py", f"--config.data.dir={folder}",
          *(f"--config.{k}={v}" for k, v in FIELDS.items())]


def _batches(config):
  """(inputs, labels) of each global batch, by hand from the train bytes."""
  text, t = TEXT["train.txt"], config.model.context
  n = len(text) - t  # windows of t + 1 bytes at every offset
  epochs = [tf.random.experimental.index_shuffle(
      tf.range(n, dtype=tf.int64), tf.constant([config.seed, e], tf.int64),
      tf.constant(n - 1, tf.int64)).numpy() for e in range(2)]
  batches = []
  for k in range(STEPS):
    starts = [epochs[j // n][j % n] for j in range(k * BATCH, (k + 1) * BATCH)]
    rows = np.array([list(text[s:s + t + 1]) for s in starts], np.int32)
    batches.append((rows[:, :-1], rows[:, 1:]))
  return batches


def _rate(opt, k: int) -> float:
  """The learning rate of update k (1-based)."""
  if k <= WARMUP:
    return opt.learning_rate * k / WARMUP
  done = (k - 1 - WARMUP) / (STEPS - WARMUP)
  return opt.learning_rate * (1 + math.cos(math.pi * done)) / 2


def plain_loop(config) -> np.ndarray:
  """Per-step losses of the LM trained by a plain TensorFlow loop."""
  opt = config.optimizer
  keras.utils.set_random_seed(config.seed)  # looper's initial weights too
  model = lm.model_fn(config)
  weights = model.trainable_variables
  moments = [[tf.Variable(tf.zeros_like(w)) for w in weights]
             for _ in range(2)]
  beta_1, beta_2, epsilon = 0.9, 0.999, 1e-7  # Keras' Adam defaults

  @tf.function
  def step(inputs, labels, k, rate):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels, model(inputs, training=True)))
    grads, _ = tf.clip_by_global_norm(tape.gradient(loss, weights),
                                      opt.clip_global_norm)
    alpha = rate * tf.sqrt(1 - beta_2**k) / (1 - beta_1**k)
    for w, g, m, v in zip(weights, grads, *moments):
      w.assign_sub(w * opt.weight_decay * rate)
      m.assign_add((g - m) * (1 - beta_1))
      v.assign_add((g * g - v) * (1 - beta_2))
      w.assign_sub(alpha * m / (tf.sqrt(v) + epsilon))
    return loss

  return np.array([
      float(step(x, y, tf.constant(k, tf.float32),
                 tf.constant(_rate(opt, k), tf.float32)))
      for k, (x, y) in enumerate(_batches(config), start=1)])


@pytest.fixture(scope="module")
def reference(corpus):
  config = configured(lm.get_config(), {"data.dir": str(corpus), **FIELDS})
  assert (config.optimizer.name, config.optimizer.schedule) == ("adamw",
                                                                "cosine")
  assert config.optimizer.weight_decay and config.optimizer.clip_global_norm
  return plain_loop(config)


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_one_replica_gives_the_plain_loops_losses(corpus, reference,
                                                  tmp_path):
  run_here(*_flags(corpus), f"--workdir={tmp_path}", "--mode=train")
  np.testing.assert_allclose(curve(tmp_path / "train"), reference,
                             rtol=1e-5)
  assert reference[-1] < reference[0] - 0.5  # it trained: no vacuous match


@pytest.mark.slow  # 2 replicas: seconds
def test_two_replicas_accumulating_give_the_plain_loops_losses(
    corpus, reference, tmp_path):
  """Each update 2 micro-batches of 4 (2 windows per replica each): the
  same 8 windows, positions [8k, 8k + 8), as one batch of 8 (on the
  session's 2 logical CPUs)."""
  run_here(*_flags(corpus), f"--workdir={tmp_path}", "--mode=train",
           "--config.distribution.num_cpu_devices=2",
           f"--config.train.batch_size={BATCH // 2}",
           "--config.train.grad_accum_steps=2")
  np.testing.assert_allclose(curve(tmp_path / "train"), reference,
                             rtol=1e-5)
