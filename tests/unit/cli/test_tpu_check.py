"""`looper check`: each crafted violation of a TPU rule gives exactly its line.

Every case is the tiny experiment (ready as it is) with one thing broken.
"""

import inspect
import json
import re

import keras
import pytest
import tensorflow as tf

from looper.cli import tpu_check
from tests.fixtures import catalogue
from tests.fixtures import configs
from tests.fixtures import paths
from tests.fixtures import processes
from tests.fixtures import tiny


def _config(**changes):
  # 64: 8 per core on 8 cores.
  return configs.configured(configs.configured(
      tiny.get_config(), train__batch_size=64, eval__batch_size=64), changes)


class PythonIf(keras.layers.Layer):
  def call(self, x):
    if tf.reduce_sum(x) > 0:  # a tensor's value decides the graph
      return x * 2.0
    return x


class DataDependentShape(keras.layers.Layer):
  def call(self, x):
    positive = tf.boolean_mask(x, x > 0)  # as many values as are positive
    return x + tf.reduce_mean(positive)


class NoXlaKernel(keras.layers.Layer):
  def call(self, x):
    digits = tf.strings.length(tf.strings.as_string(x))  # string ops: host only
    return x + tf.cast(digits, x.dtype)


class Subclassed(keras.Model):
  """Built eagerly on one example by looper (no symbolic Input), so only
  the traced step meets the layer's problem."""

  def __init__(self, layer):
    super().__init__()
    self.inner, self.dense = layer(), keras.layers.Dense(tiny.NUM_CLASSES)

  def call(self, x):
    return self.dense(self.inner(x))


def _model_with(layer):
  return lambda config: Subclassed(layer)


def _train_split_mapped(fn):
  """tiny's data with `fn(dataset)` applied to the train split only."""
  def dataset_fn(config, split):
    dataset = tiny.dataset_fn(config, split)
    return fn(dataset) if split == config.data.train_split else dataset
  return dataset_fn


def _from_generator(dataset):
  x, y = next(iter(dataset.batch(100_000)))
  spec = dataset.element_spec
  return tf.data.Dataset.from_generator(
      lambda: zip(x.numpy(), y.numpy()), output_signature=spec)


def _lengths_vary(config, split):
  """Sequences whose length changes every 64 examples (one global batch)."""
  del config, split
  return tf.data.Dataset.range(64 * 30).map(
      lambda i: (tf.zeros([8 + i // 64]), tf.cast(i % 4, tf.int32)))


def _pooled_model(config):
  return keras.Sequential([keras.Input((None,)), keras.layers.Reshape((-1, 1)),
                           keras.layers.GlobalAveragePooling1D(),
                           keras.layers.Dense(tiny.NUM_CLASSES)])


# The line of PythonIf's `if`: the one the problem must point at.
_IF_LINE = inspect.getsourcelines(PythonIf.call)[1] + 1

CASES = {
    "python_if": (dict(model_fn=_model_with(PythonIf)),
                  catalogue.line("check-python-if",
                                 where=f"test_tpu_check.py:{_IF_LINE}")),
    "data_dependent_shape": (
        dict(model_fn=_model_with(DataDependentShape)),
        catalogue.line("check-data-dependent-shape")),
    "no_xla_kernel": (dict(model_fn=_model_with(NoXlaKernel)),
                      catalogue.line("check-no-xla-kernel")),
    "dynamic_example_shape": (
        dict(model_fn=_pooled_model, dataset_fn=_lengths_vary),
        catalogue.line("check-variable-shape")),
    "many_shapes": (dict(model_fn=_pooled_model, dataset_fn=_lengths_vary,
                         **{"data.bucket": 1, "data.shuffle_buffer": 0}),
                    catalogue.line("check-many-shapes")),
    "python_in_pipeline": (
        dict(dataset_fn=_train_split_mapped(_from_generator)),
        catalogue.line("check-python-in-pipeline")),
    "float64": (dict(dataset_fn=_train_split_mapped(
        lambda d: d.map(lambda x, y: (tf.cast(x, tf.float64), y)))),
                catalogue.line("check-float64-inputs")),
    "int64_labels": (dict(dataset_fn=_train_split_mapped(
        lambda d: d.map(lambda x, y: (x, tf.cast(y, tf.int64))))),
                     catalogue.line("check-int64-labels")),
    "batch_not_divisible": (
        {"train.batch_size": 36},
        catalogue.line("check-batch-over-cores")),
    "float16_on_tpu": (
        {"train.precision": "mixed_float16"},
        catalogue.line("check-float16-on-tpu")),
    "batch_per_core_small": (
        {"train.batch_size": 32},
        r"gives 4 examples per TPU core \(8 cores\).*batch_size=64"),
}


def test_the_tiny_experiment_is_ready():
  config = _config()
  assert tpu_check.check(config) == []
  assert tpu_check.report([], config, 8).startswith(
      "ready: the train and eval steps compile with XLA")


@pytest.mark.parametrize("flags,noted", [(set(), True), ({"amx_bf16"}, False)],
                         ids=["cpu-without-bf16", "cpu-with-amx"])
def test_a_precision_slower_on_this_machine_is_noted(monkeypatch, flags,
                                                     noted):
  from looper.options import precision  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
  config = _config(**{"train.precision": "mixed_bfloat16"})
  lines = tpu_check.report([], config, 8).splitlines()
  assert lines[0].startswith("ready: ")
  assert lines[1:] == ([
      "note: train.precision=mixed_bfloat16 on this machine: ~0.7x float32"
      " on a CPU without bfloat16 instructions (this one has neither"
      " amx_bf16 nor avx512_bf16; bfloat16 pays on TPUs and CPUs with"
      " either); set --config.train.precision=float32"]
                       if noted else [])


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_violation_gives_exactly_its_line(case):
  changes, pattern = CASES[case]
  problems = tpu_check.check(_config(**changes))
  assert len(problems) == 1, problems
  assert "\n" not in problems[0]
  assert re.search(pattern, problems[0]), problems[0]


@pytest.mark.slow  # a subprocess
def test_cli_exit_codes_and_lines():
  ok = processes.run_looper("check", "--config=tests/fixtures/tiny.py",
                           "--config.train.batch_size=64",
                           "--config.eval.batch_size=64")
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert ok.stdout.startswith("ready: ")
  bad = processes.run_looper("--mode=check", "--config=tests/fixtures/tiny.py",
                            "--cores=32")
  assert bad.returncode == 1
  assert bad.stdout.splitlines() == [
      "looper check: config.train.batch_size=32 gives 1 examples per TPU"
      " core (32 cores); a core pads to a multiple of 8, so set"
      " --config.train.batch_size=256 (the TPU guides use 128 per core:"
      " 4096)"]


def test_mnist_is_ready():
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  c = mnist.get_config()
  c.data.dir = str(paths.MNIST_DIR)
  c.data.train_split, c.data.eval_split = "test[:8000]", ""
  # Each eval set's input is checked (as a run evaluates each).
  c.data.eval_splits = {"val": "test[8000:9000]", "test": "test[9000:]"}
  c.model.width = 8
  assert tpu_check.check(c, cores=8) == []


def test_describe_names_the_modes_sizes_and_specs_in_process():
  from looper.cli import describe  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  c.data.as_arrays = True
  c.data.eval_splits = {"val": "test[:50%]", "test": "test[50%:]"}
  text = describe.describe(c)
  # tiny: 1001 examples per split, 8 float features, an int32 class id;
  # each eval set named by its field (the bare data.eval_split: test_cli).
  spec = "array mode; inputs float32[8], labels int32[]"
  assert [l for l in text.splitlines() if l.startswith("  data.")] == [
      f"  data.train_split='train': 1,001 examples, {spec}",
      f"  data.eval_splits['test']='test[50%:]': 501 examples, {spec}",
      f"  data.eval_splits['val']='test[:50%]': 500 examples, {spec}"]
  assert json.loads(text.split("\nconfig\n", 1)[1])["train"]["steps"] == 40


@pytest.mark.parametrize("name,accelerated,flags,want", [
    ("float32", False, set(), None),
    ("mixed_bfloat16", False, {"avx512f", "avx512_vnni"}, (
        "~0.7x float32 on a CPU without bfloat16 instructions (this one has"
        " neither amx_bf16 nor avx512_bf16; bfloat16 pays on TPUs and CPUs"
        " with either); set --config.train.precision=float32")),
    ("mixed_bfloat16", False, {"amx_bf16", "amx_tile"}, None),
    ("mixed_bfloat16", False, {"avx512f", "avx512_bf16"}, None),
    ("mixed_bfloat16", True, set(), None),  # a GPU or TPU run
    ("mixed_float16", False, {"amx_bf16"}, (
        "for GPUs: ~170x slower than float32 on a CPU; set"
        " --config.train.precision=float32")),
    ("mixed_float16", True, set(), None),
])
def test_a_precision_slower_than_float32_here_is_named(name, accelerated,
                                                       flags, want):
  from looper.options import precision  # pylint: disable=g-import-not-at-top
  assert precision.slower_here(name, accelerated=accelerated,
                               flags=flags) == want


def test_describe_says_when_the_precision_is_slower_on_this_machine():
  from looper.cli import describe  # pylint: disable=g-import-not-at-top
  if tf.config.list_physical_devices("GPU"):
    pytest.skip("a GPU run: float16 is its precision")
  c = tiny.get_config()
  c.train.precision = "mixed_float16"
  lines = describe.describe(c).splitlines()
  assert ("  precision  mixed_float16 (slower here: for GPUs: ~170x slower"
          " than float32 on a CPU; set --config.train.precision=float32)"
          ) in lines
