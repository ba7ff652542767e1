"""The docs work: every command and code block in README.md and BUILD.md.

- Every `--config.FIELD` either file mentions exists in the default config
  or in a shipped experiment's (a renamed field breaks this test, not a
  user).
- Every looper command with a concrete `--config=FILE` (code blocks and
  inline) parses with looper's own flag parser and validates.
- The quickstart runs for real, shrunk to a few steps (the way Flax's
  examples test their configs): the real MNIST `get_config()` and data,
  then the `tensorboard --logdir` it names exists with events.
- The Python blocks run: the 15-line experiment trains, the Trainer
  subclasses (a custom loss, a two-optimizer GAN step) train and resume.
"""

import json
import logging
import re
import shlex

import keras
import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import run
from looper import workdir as workdir_lib
from looper.measure import goodput
from looper.workdir import jsonl
from tests.fixtures import tiny
from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import MNIST_DIR, ROOT
from tests.fixtures.processes import run_ok

DOCS = {name: (ROOT / name).read_text() for name in ("README.md", "BUILD.md")}
# common.py holds what the experiments share; it is not one.
EXPERIMENTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                     if p.stem not in ("__init__", "common"))
# Commands that are not looper's, or need what this machine has not.
NOT_LOOPER = ("pip ", "tensorboard ", "gcloud ", "kaggle ", "unzip ",
              "python -m pytest", "TF_CONFIG=", "!pip")


def _blocks(language: str) -> list[str]:
  return [block for text in DOCS.values() for block in
          re.findall(rf"```{language}\n(.*?)```", text, re.S)]


def _commands() -> list[str]:
  """Shell commands of the sh blocks (continuations joined) and inline ones."""
  commands = []
  for block in _blocks("sh"):
    joined = block.replace("\\\n", " ")
    commands += [l.strip() for l in joined.splitlines()
                 if l.strip() and not l.strip().startswith("#")]
  for text in DOCS.values():
    commands += re.findall(r"`((?:looper|python -m looper\.main) [^`]+)`",
                           text.replace("\n  ", " "))
  return commands


def _looper_args(command: str) -> list[str] | None:
  """The flags of a runnable looper command; None for any other."""
  words = shlex.split(command)
  if words[:3] == ["python", "-m", "looper.main"]:
    return words[3:]
  if words[:1] == ["looper"] and len(words) > 1 and words[1] not in (
      "launch", "runs", "data_service"):
    mode = [] if words[1].startswith("-") else [f"--mode={words[1]}"]
    return mode + words[1 + bool(mode):]
  return None


def _config_fields() -> set[str]:
  """Every field path of the default config and the shipped experiments."""
  import importlib  # pylint: disable=g-import-not-at-top
  fields = set()

  def walk(prefix, node):
    for key in node.keys():
      value = node[key]
      if hasattr(value, "keys"):
        walk(f"{prefix}{key}.", value)
      fields.add(prefix + key)
  walk("", lc.default_config())
  for name in EXPERIMENTS:
    walk("", importlib.import_module(f"experiments.{name}").get_config())
  return fields


def test_every_config_field_the_docs_name_exists():
  named = {m for text in DOCS.values()
           for m in re.findall(r"--config\.([a-z_.]*[a-z_])", text)}
  named -= {"train.step"}  # the misspelt field of the "did you mean" example
  assert named, "the docs name no --config fields?"
  fields = _config_fields()
  assert not sorted(named - fields), sorted(named - fields)


def _files_to_write() -> set[str]:
  """The experiment files the README has the reader write: its Python
  blocks that open with `# experiments/NAME.py`."""
  return {m.group(1) for block in _blocks("python")
          for m in [re.match(r"# (experiments/\w+\.py)\n", block)] if m}


def test_every_concrete_looper_command_parses_and_validates():
  written = _files_to_write()
  assert written == {"experiments/linear.py", "experiments/mnist_fit.py"}
  parsed = 0
  for command in _commands():
    if command.startswith(NOT_LOOPER):
      continue
    args = _looper_args(command)
    if args is None or any("..." in a or "<" in a for a in args):
      continue  # a sketch (`--config=...`), not a command to copy
    config_file = next((a.split("=", 1)[1] for a in args
                        if a.startswith("--config=")), None)
    if config_file is None:
      continue
    if not (ROOT / config_file.split(":")[0]).exists():
      # A file the README has the reader write (linear.py: run by
      # test_the_fifteen_line_experiment_trains); nothing else may be missing.
      assert config_file in written, command
      continue
    overrides = [a for a in args if a.startswith("--config.")]
    config = _load(config_file, overrides)
    lc.validate(config)
    parsed += 1
  assert parsed >= 6, parsed  # the quickstart and the experiments table


def _load(config_file: str, overrides: list[str]):
  """The config file's get_config() (with what follows a ':', as
  config_flags passes it) with the overrides applied the way ml_collections
  applies them: a missing field or a wrong type raises."""
  import ast  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  config_file, _, preset = config_file.partition(":")
  spec = importlib.util.spec_from_file_location("doc_config",
                                                ROOT / config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(*[preset] if preset else [])
  for override in overrides:
    path, value = override[len("--config."):].split("=", 1)
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass  # a string, like the shell passes it
    *parents, field = path.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[field] = value
  return config


@pytest.mark.slow  # a subprocess
def test_quickstart_runs_shrunk_and_tensorboard_finds_it(tmp_path):
  # The quickstart's block: the first that trains.
  block = next(b for b in _blocks("sh") if "looper train_and_eval" in b)
  command = next(c for c in _commands() if c.startswith("looper train_and_"))
  args = _looper_args(command)
  workdir = next(a.split("=", 1)[1] for a in args if a.startswith("--work"))
  args = [a.replace(workdir, str(tmp_path / "mnist")) for a in args]
  # A few steps of the real config on the real data: seconds, not minutes.
  args += ["--config.train.steps=20", "--config.train.steps_per_loop=10",
           "--config.eval.every_steps=20", "--config.eval.steps=1",
           "--config.profile.start_step=10", "--config.profile.num_steps=2"]
  proc = run_ok(*args)
  assert f"tensorboard --logdir={workdir}" in block
  assert f"  tensorboard --logdir={tmp_path / 'mnist'}" in proc.stderr
  events = list((tmp_path / "mnist").glob("*/events.out.tfevents.*"))
  assert {p.parent.name for p in events} == {"train", "eval", "hparams"}
  lines = (tmp_path / "mnist" / "metrics.jsonl").read_text().splitlines()
  # Loops end at 10, on each step of the profile window, and at 20.
  assert [(json.loads(l)["kind"], json.loads(l)["step"]) for l in lines] == [
      ("start", 0), ("train", 10), ("train", 11), ("train", 12),
      ("train", 20), ("eval", 20)]
  assert list((tmp_path / "mnist" / "train" / "plugins" / "profile").glob(
      "*/*.xplane.pb"))


def _python_block(marker: str) -> str:
  (block,) = [b for b in _blocks("python") if marker in b]
  return block


@pytest.mark.slow  # a subprocess
def test_the_fifteen_line_experiment_trains(tmp_path):
  """Exactly the README's file and command (its 500 steps)."""
  block = _python_block("# experiments/linear.py")
  assert len(block.strip().splitlines()) <= 20
  path = tmp_path / "linear.py"
  path.write_text(block)
  run_ok(f"--config={path}", f"--workdir={tmp_path / 'run'}")
  accuracy = scalars(tmp_path / "run" / "eval", "accuracy")
  assert list(accuracy) == [500] and accuracy[500] > 0.95
  assert scalars(tmp_path / "run" / "eval", "examples") == {500: 1000}


@pytest.mark.slow  # MNIST's CNN for 32 steps and a 10,000-image eval
def test_the_fit_port_trains_with_its_keras_objects_and_epochs(
    tmp_path, monkeypatch):
  """README's experiments/mnist_fit.py as written (Keras' loss and metric
  objects, epochs, early stopping), on the repository's MNIST test set
  for both splits (Keras' loader would download): a fifth of an epoch."""
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  data = mnist.get_config().data
  data.dir = str(MNIST_DIR)
  images, labels = mnist.load_mnist("test", data)
  monkeypatch.setattr(keras.datasets.mnist, "load_data",
                      lambda: ((images, labels), (images, labels)))
  namespace = {}
  exec(_python_block("# experiments/mnist_fit.py"), namespace)  # pylint: disable=exec-used
  c = namespace["get_config"]()
  c.train.epochs = 0.2
  result = run.run(c, str(tmp_path), verbose=False)
  assert result["step"] == -(-2000 // 64)  # ceil(0.2 x 10,000 / 64)
  logs = result["eval"]
  assert logs["examples"] == 10000
  assert 0.5 < logs["accuracy"] < logs["sparse_top_k_categorical_accuracy"]


@pytest.mark.slow  # MNIST's CNN compiled for a step and two sets
def test_the_fit_port_evaluates_exactly_each_slice_of_two_eval_sets(
    tmp_path, monkeypatch):
  """README's experiments/mnist_fit.py as written, with README's two eval
  sets of one split ('test[:50%]', 'test[50%:]'): each set is its slice
  (of a 101-image test split: rows 0-49 and 50-100), its count and its
  loss and accuracies NumPy's on those rows through the trained model."""
  from experiments import mnist  # pylint: disable=g-import-not-at-top
  data = mnist.get_config().data
  data.dir = str(MNIST_DIR)
  images, labels = mnist.load_mnist("test", data)
  train, test = (images[:64], labels[:64]), (images[64:165], labels[64:165])
  monkeypatch.setattr(keras.datasets.mnist, "load_data",
                      lambda: (train, test))
  namespace = {}
  exec(_python_block("# experiments/mnist_fit.py"), namespace)  # pylint: disable=exec-used
  c = namespace["get_config"]()
  built = []  # the run's model, to compute its figures here
  c.model_fn = lambda config: built.append(
      namespace["model_fn"](config)) or built[-1]
  c.data.eval_split = ""
  c.data.eval_splits = {"val": "test[:50%]", "test": "test[50%:]"}
  c.checkpoint.best_metric = "val/accuracy"
  c.train.epochs = 1  # one step of 64
  logs = run.run(c, str(tmp_path), verbose=False)["eval"]
  (model,) = built
  x = (test[0][..., None] / 255).astype("float32")
  for name, rows in (("val", slice(0, 50)), ("test", slice(50, 101))):
    logits = model(x[rows]).numpy().astype(np.float64)
    y = test[1][rows].astype(np.int64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    top3 = np.argsort(-logits, axis=1)[:, :3]
    want = {"examples": len(y), "loss": -log_p[np.arange(len(y)), y].mean(),
            "accuracy": (logits.argmax(axis=1) == y).mean(),
            "sparse_top_k_categorical_accuracy": (top3 == y[:, None]).any(
                axis=1).mean()}
    got = {k: logs[f"{name}/{k}"] for k in want}
    np.testing.assert_allclose(list(got.values()), list(want.values()),
                               rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("name", ["SmoothedTrainer", "GanTrainer"])
@pytest.mark.slow  # over 2 s: out of the fast lane
def test_trainer_subclasses_train_and_resume(name, tmp_path, caplog):
  namespace = {}
  exec(_python_block(f"class {name}"), namespace)  # pylint: disable=exec-used
  c = tiny.get_config()
  c.trainer = namespace[name]
  c.train.steps = 10
  if name == "SmoothedTrainer":  # its loss is written for MNIST's 10 classes
    c.model_fn = lambda config: keras.Sequential(
        [keras.Input((tiny.FEATURES,)), keras.layers.Dense(10)])
  if name == "GanTrainer":  # what the block's comment says to set
    c.metrics = ()
    c.loss = lambda labels, logits: tf.nn.sigmoid_cross_entropy_with_logits(
        tf.ones_like(logits), logits)[:, 0]
  first = run.run(c, str(tmp_path), "train")
  c.train.steps = 20
  with caplog.at_level(logging.INFO, logger="absl"):
    second = run.run(c, str(tmp_path), "train_and_eval")
  assert (first["step"], second["step"]) == (10, 20)
  assert tf.math.is_finite(second["eval"]["loss"])
  # Resumed, not started over: from the first run's save, steps 11-20.
  assert any(f"resumed from {tmp_path}/checkpoints/ckpt-10" in
             r.getMessage() for r in caplog.records)
  records = goodput.read(workdir_lib.Workdir(str(tmp_path)))
  assert [(r["first_step"], r["steps"], r["recomputed_steps"])
          for r in records] == [(0, 10, 0), (10, 10, 0)]
  assert len(curve(tmp_path / "train")) == 20  # steps 1-20, each once
  assert [(l["kind"], l["step"]) for l in jsonl.read(str(
      tmp_path / "metrics.jsonl"))] == [
          ("start", 0), ("train", 10), ("train", 20), ("eval", 20)]
  if name == "GanTrainer":  # the second optimizer was saved and restored
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints"))
    keys = reader.get_variable_to_shape_map()
    assert any(k.startswith("g_optimizer/") for k in keys), sorted(keys)[:9]
    # Noise drawn anew each step, counted on across the resume.
    assert reader.get_tensor("draws/.ATTRIBUTES/VARIABLE_VALUE") == 20
    # Its two losses, per-step values: each step's once in TensorBoard
    # across the resume (their sum the loss), each loop's mean in
    # metrics.jsonl and the result.
    parts = {k: curve(tmp_path / "train", k) for k in ("d_loss", "g_loss")}
    np.testing.assert_allclose(parts["d_loss"] + parts["g_loss"],
                               curve(tmp_path / "train"), rtol=1e-6)
    lines = [l for l in jsonl.read(str(tmp_path / "metrics.jsonl"))
             if l["kind"] == "train"]
    for k, values in parts.items():
      np.testing.assert_allclose([l[k] for l in lines],
                                 values.reshape(2, 10).mean(axis=1), rtol=1e-6)
      assert second["train"][k] == lines[-1][k]


def test_docs_name_every_experiment():
  for name in EXPERIMENTS:
    assert f"`{name}.py`" in DOCS["README.md"], name




@pytest.mark.slow  # over 2 s: out of the fast lane
def test_the_callbacks_example_runs_and_resumes(tmp_path, capsys):
  """README's callbacks on tiny: one CSV row and line per epoch, and its
  own callback's `checkpointed` count carried across a restart."""
  namespace = {}
  exec(_python_block("class Epochs(").replace("/tmp/", f"{tmp_path}/"),  # pylint: disable=exec-used
       namespace)
  c = tiny.get_config()
  c.callbacks = namespace["callbacks"](c)
  run.run(c, str(tmp_path / "run"), verbose=False)  # 40 steps, eval every 20
  assert capsys.readouterr().out.count("val_accuracy") == 2
  c.train.steps, c.callbacks = 60, namespace["callbacks"](c)
  run.run(c, str(tmp_path / "run"), verbose=False)
  assert c.callbacks[-1].seen == 3  # 2 before the restart, 1 after
  rows = (tmp_path / "mnist_fit_epochs.csv").read_text().splitlines()
  assert rows[0] == "epoch,accuracy,learning_rate,loss,val_accuracy,val_loss"
  assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"]
