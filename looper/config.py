"""The config every experiment inherits: defaults, validation, resolution, JSON.

Synopsis (an experiment file)::

    from looper import config as lc

    def model_fn(config): ...            # -> keras.Model returning logits
    def dataset_fn(config, split): ...   # -> tf.data.Dataset of (inputs, label)

    def get_config():
      c = lc.default_config()
      c.model_fn = model_fn              # or the string 'my.module:model_fn'
      c.dataset_fn = dataset_fn
      c.train.steps = 1000
      return c

Every error raised here is one line naming the field, the value and the fix,
so a bad `--config.*` override fails before TensorFlow touches a device.
"""

import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
from typing import Any

import ml_collections
from ml_collections import config_dict

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "linear")

# A split is a name with an optional TFDS-style slice: 'train', 'test[:8000]',
# 'test[8000:]', 'train[10%:90%]'.
_SPLIT_RE = re.compile(r"^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")


class ConfigError(ValueError):
  """A config value is wrong; the message is one line naming field and fix."""


def _object_field(default):
  # A field that holds a callable, a class or a 'module:name' string. Without
  # field_type=object ml_collections would fix its type at the first value.
  return config_dict.FieldReference(default, field_type=object)


def default_config() -> ml_collections.ConfigDict:
  """Returns the defaults every experiment starts from (field by field)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The experiment: callables or 'module:function' strings (see module doc).
  c.model_fn = _object_field(None)
  c.dataset_fn = _object_field(None)
  # Trainer class to run; subclass looper.trainer.Trainer to change a step.
  c.trainer = _object_field("looper.trainer:Trainer")
  # Per-example loss on the model's logits: a name or fn(labels, logits).
  c.loss = _object_field("sparse_categorical_crossentropy")
  # Metrics on logits, by name (see trainer.METRICS) or zero-arg factories.
  c.metrics = ("accuracy",)

  c.train = ml_collections.ConfigDict()
  c.train.steps = 1000
  c.train.batch_size = 128  # GLOBAL batch, split evenly over the replicas.
  # Steps run inside one tf.function call; evaluation, checkpoints and the
  # end clamp a loop so they land exactly on their step.
  c.train.steps_per_loop = 100

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 1000  # 0: evaluate only at the end of training.
  c.eval.batch_size = 256  # GLOBAL batch; the last one is padded and masked.
  c.eval.steps = config_dict.placeholder(int)  # None: the whole eval split.

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adam"  # sgd | adam | adamw
  c.optimizer.learning_rate = 1e-3
  c.optimizer.schedule = "constant"  # constant | cosine | linear (to 0)
  c.optimizer.warmup_steps = 0  # linear warmup from 0 before the schedule
  c.optimizer.momentum = 0.9  # sgd only
  c.optimizer.weight_decay = 0.0  # adamw only

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 1000  # 0: save only at the end.
  c.checkpoint.keep = 3

  c.distribution = ml_collections.ConfigDict()
  c.distribution.strategy = "auto"  # see STRATEGIES; auto picks from below
  c.distribution.num_cpu_devices = 1  # >1: split the CPU, mirror over it
  c.distribution.tpu = ""  # TPU name or grpc:// address ('local' on a VM)

  c.data = ml_collections.ConfigDict()
  c.data.dir = ""  # where the experiment's dataset_fn reads its files
  c.data.train_split = "train"
  c.data.eval_split = "test"
  c.data.shuffle_buffer = 10_000  # 0: keep the dataset's order

  c.model = ml_collections.ConfigDict()  # the experiment's own fields
  return c


def resolve(value: Any, field: str) -> Any:
  """Returns the object a config field names: itself, or 'module:attr' loaded.

  Args:
    value: a callable/class, or a 'module:attribute' string.
    field: the config field, for the error message (e.g. 'model_fn').

  Raises:
    ConfigError: the value is missing, malformed or cannot be imported.
  """
  if value is None:
    raise ConfigError(
        f"config.{field} is not set; assign a function in get_config() or a"
        f" 'module:function' string")
  if not isinstance(value, str):
    return value
  module_name, sep, attr = value.rpartition(":")
  if not sep or not module_name or not attr:
    raise ConfigError(
        f"config.{field}={value!r} is not 'module:name'; write it like"
        f" 'experiments.mnist:model_fn' or 'experiments/mnist.py:model_fn'")
  try:
    obj = _import(module_name)
  except (ImportError, FileNotFoundError) as e:
    raise ConfigError(
        f"config.{field}={value!r}: cannot import module {module_name!r}"
        f" ({e}); make it importable from the working directory or"
        f" PYTHONPATH") from None
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise ConfigError(
          f"config.{field}={value!r}: {module_name!r} has no attribute"
          f" {attr!r}; check the name after ':'")
    obj = getattr(obj, part)
  return obj


def _import(module: str):
  """Imports a module by dotted name, or a config file by its .py path."""
  if not module.endswith(".py"):
    return importlib.import_module(module)
  spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(module))[0], module)
  loaded = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(loaded)
  return loaded


def parse_split(split: str, field: str = "data.split"):
  """Parses 'name[start:stop]' into (name, start, stop); % bounds are kept.

  Returns:
    (name, start, stop) where start/stop are None, ints, or strings such as
    '10%' that `split_slice` turns into indices once the size is known.
  """
  match = _SPLIT_RE.match(split.strip()) if isinstance(split, str) else None
  if not match:
    raise ConfigError(
        f"config.{field}={split!r} is not a split; write 'train', "
        f"'test[:8000]', 'test[8000:]' or 'train[:90%]'")
  name, start, stop = match.groups()
  as_bound = lambda b: b if b is None or b.endswith("%") else int(b)
  return name, as_bound(start), as_bound(stop)


def split_slice(split: str, num_examples: int, field: str = "data.split"):
  """Returns (name, slice) of `split` over a set of `num_examples` examples."""
  name, start, stop = parse_split(split, field)

  def index(bound):
    if isinstance(bound, str):
      return int(round(num_examples * int(bound[:-1]) / 100))
    return bound

  selected = slice(index(start), index(stop))
  if not range(num_examples)[selected]:
    raise ConfigError(
        f"config.{field}={split!r} selects no examples of the {num_examples}"
        f" in {name!r}; widen the slice")
  return name, selected


def _check(ok: bool, field: str, value: Any, fix: str):
  if not ok:
    raise ConfigError(f"config.{field}={value!r}: {fix}")


def _check_choice(value: Any, field: str, choices) -> None:
  if value not in choices:
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"config.{field}={value!r} is not one of {', '.join(choices)};"
        f" {hint}set --config.{field}")


def validate(c: ml_collections.ConfigDict) -> None:
  """Checks every field looper reads; raises ConfigError on the first bad one."""
  for field in ("model_fn", "dataset_fn", "trainer"):
    _check(callable(resolve(c[field], field)), field, c[field],
           "must name a callable")
  _check(callable(c.loss) or isinstance(c.loss, str), "loss", c.loss,
         "give a loss name or a fn(labels, logits) -> per-example loss")
  _check(isinstance(c.metrics, (tuple, list)), "metrics", c.metrics,
         "give a tuple of metric names, e.g. ('accuracy',)")
  positive = [("train.steps", c.train.steps),
              ("train.batch_size", c.train.batch_size),
              ("train.steps_per_loop", c.train.steps_per_loop),
              ("eval.batch_size", c.eval.batch_size),
              ("checkpoint.keep", c.checkpoint.keep),
              ("distribution.num_cpu_devices",
               c.distribution.num_cpu_devices)]
  for field, value in positive:
    _check(isinstance(value, int) and value >= 1, field, value,
           f"must be a whole number >= 1; set --config.{field}")
  for field, value in [("eval.every_steps", c.eval.every_steps),
                       ("checkpoint.every_steps", c.checkpoint.every_steps),
                       ("data.shuffle_buffer", c.data.shuffle_buffer),
                       ("optimizer.warmup_steps", c.optimizer.warmup_steps)]:
    _check(isinstance(value, int) and value >= 0, field, value,
           f"must be a whole number >= 0; set --config.{field}")
  _check(c.eval.steps is None or c.eval.steps >= 1, "eval.steps",
         c.eval.steps, "must be >= 1, or None for the whole eval split")
  _check(c.optimizer.learning_rate > 0, "optimizer.learning_rate",
         c.optimizer.learning_rate, "must be > 0")
  _check(c.optimizer.warmup_steps <= c.train.steps, "optimizer.warmup_steps",
         c.optimizer.warmup_steps, f"must be <= train.steps={c.train.steps}")
  _check_choice(c.optimizer.name, "optimizer.name", OPTIMIZERS)
  _check_choice(c.optimizer.schedule, "optimizer.schedule", SCHEDULES)
  _check_choice(c.distribution.strategy, "distribution.strategy", STRATEGIES)
  if c.distribution.strategy == "tpu":
    _check(bool(c.distribution.tpu), "distribution.tpu", c.distribution.tpu,
           "strategy 'tpu' needs the TPU name or address (use 'local' on a"
           " TPU VM)")
  parse_split(c.data.train_split, "data.train_split")
  parse_split(c.data.eval_split, "data.eval_split")


def _jsonable(value: Any) -> Any:
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if callable(value):  # functions and classes: the string `resolve` reads
    module = value.__module__
    top_level = module.split(".")[0]
    if importlib.machinery.PathFinder.find_spec(top_level) is None:
      # Defined in a config file loaded by path (config_flags gives it a
      # private module name): name the file instead.
      module = os.path.relpath(inspect.getfile(value))
    return f"{module}:{value.__qualname__}"
  return value


def to_json(c: ml_collections.ConfigDict) -> str:
  """The resolved config as JSON; callables become 'module:name' strings."""
  return json.dumps(_jsonable(c.to_dict()), indent=2, sort_keys=True)


def override_error(exc: BaseException, argv) -> str:
  """Turns ml_collections' multi-line 'no such field' error into one line.

  Args:
    exc: what parsing a `--config.x.y=v` flag raised.
    argv: the command line, to name the flag that caused it.
  """
  text = str(exc).replace("\\n", "\n").replace("\\'", "'")
  key = re.search(r"""^['"]*(?:Key ")?([\w.]+)""", text)
  suggestion = re.search(r'Did you mean "([\w.]+)"', text)
  bad = key.group(1) if key else "?"
  flag = next((a.split("=")[0] for a in argv[1:]
               if a.startswith("--config.") and
               re.search(rf"\.{re.escape(bad)}(\.|=|$)", a.split("=")[0])),
              f"--config...{bad}")
  head, _, tail = flag.rpartition(bad)
  hint = (f"did you mean {head}{suggestion.group(1)}{tail}?"
          if suggestion else "run with --helpfull to list the config fields")
  return f"{flag}: the config has no field {bad!r}; {hint}"

