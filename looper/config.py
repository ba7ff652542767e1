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
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import sys
import traceback
import types
from typing import Any

from absl import flags
import ml_collections
from ml_collections import config_dict

from looper import precision

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "linear")
BEST_MODES = ("max", "min")

# Keys looper itself puts in the train and eval logs; a metric with one of
# these names would overwrite them (see `check_metric_names`).
RESERVED_METRIC_NAMES = ("loss", "examples", "learning_rate", "steps_per_sec",
                         "examples_per_sec", "input_wait_fraction")
# How `to_json` marks a callable that no 'module:name' string can load back.
UNLOADABLE = "<unloadable: "

# A split is a name with an optional TFDS-style slice: 'train', 'test[:8000]',
# 'test[8000:]', 'train[10%:90%]'.
_SPLIT_RE = re.compile(r"^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")


class ConfigError(ValueError):
  """A config value is wrong; the message is one line naming field and fix."""


def first_line(e: BaseException) -> str:
  """The informative first line of an error, for a one-line message.

  Keras leads with a generic "Exception encountered when calling ..." line
  and colours the rest for a terminal; both are dropped.
  """
  text = re.sub(r"\x1b\[[0-9;]*m", "", getattr(e, "message", None) or str(e))
  lines = [l.strip() for l in text.splitlines() if l.strip() and
           not l.startswith("Exception encountered when calling")]
  return lines[0] if lines else type(e).__name__


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
  # On a NaN/inf loss: restore the last checkpoint, skip the data that blew
  # up and go on, at most this many times; 0 stops with an error at once.
  c.train.nan_recovery_tries = 0
  # Stop after this many evaluations without improving
  # checkpoint.best_metric (needs it set); 0: never stop early.
  c.train.early_stop_patience = 0
  # float32 | mixed_bfloat16 (CPU with AMX, TPU) | mixed_float16 (GPU, with
  # loss scaling): see looper/precision.py.
  c.train.precision = "float32"
  # XLA-compile each replica's forward and backward pass (not the loop).
  c.train.jit_compile = False
  # Micro-batches of train.batch_size per optimizer update: the update is
  # that of one batch grad_accum_steps times larger (train.steps counts
  # updates; the data position advances by the larger batch).
  c.train.grad_accum_steps = 1

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 1000  # 0: evaluate only at the end of training.
  c.eval.batch_size = 256  # GLOBAL batch; the last one is padded and masked.
  c.eval.steps = config_dict.placeholder(int)  # None: the whole eval split.
  # --mode=continuous_eval stops after this long without a new checkpoint.
  c.eval.timeout_secs = 3600.0

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adam"  # sgd | adam | adamw
  c.optimizer.learning_rate = 1e-3
  c.optimizer.schedule = "constant"  # constant | cosine | linear (to 0)
  # Linear warmup before the schedule: update k uses k/warmup_steps of it.
  c.optimizer.warmup_steps = 0
  c.optimizer.momentum = 0.9  # sgd only
  c.optimizer.weight_decay = 0.0  # adamw only
  # Clip the global-batch gradient to this global norm (0: off); applied
  # after the replicas' sum, unlike Keras' clipnorm.
  c.optimizer.clip_global_norm = 0.0
  # Keep an exponential moving average of the weights with this decay
  # (e.g. 0.999; 0: off); eval and export use it. Checkpointed.
  c.optimizer.ema_decay = 0.0
  # Linear scaling (Goyal et al.): the rate used is learning_rate *
  # train.batch_size / reference_batch_size; pair it with warmup_steps.
  c.optimizer.scale_lr_with_batch = False
  c.optimizer.reference_batch_size = 256

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 1000  # 0: save only at the end.
  c.checkpoint.keep = 3
  # Also save when this long has passed since the last save (0: off), so a
  # preemptible job loses at most this much work whatever the step time.
  c.checkpoint.every_secs = 0.0
  # Write checkpoints in a background thread (TensorFlow's async saving).
  # Not `async`: that is a Python keyword, `c.checkpoint.async` won't parse.
  c.checkpoint.async_save = False
  # Keep the checkpoint with the best value of this eval metric (e.g.
  # 'accuracy', or 'loss' with best_mode='min') in checkpoints/best/.
  c.checkpoint.best_metric = ""
  c.checkpoint.best_mode = "max"  # max | min

  # Warm start: weights from another run's checkpoint before step 0 (only
  # when the workdir has no checkpoint of its own).
  c.init = ml_collections.ConfigDict()
  c.init.checkpoint = ""  # a checkpoint prefix or a checkpoints/ directory
  c.init.optimizer = False  # also restore the optimizer slots

  c.distribution = ml_collections.ConfigDict()
  c.distribution.strategy = "auto"  # see STRATEGIES; auto picks from below
  c.distribution.num_cpu_devices = 1  # >1: split the CPU, mirror over it
  c.distribution.tpu = ""  # TPU name or grpc:// address ('local' on a VM)
  # A dry run of the TPU start-up checks (batch per core) off a TPU: the
  # cores the real run will have. 0: check only on a TPU.
  c.distribution.tpu_cores = 0
  # multi_worker: how long a worker waits for the others to come up before
  # failing with one line naming the missing ones.
  c.distribution.worker_timeout_secs = 300.0

  c.data = ml_collections.ConfigDict()
  c.data.dir = ""  # where the experiment's dataset_fn reads its files
  c.data.train_split = "train"
  c.data.eval_split = "test"
  c.data.shuffle_buffer = 10_000  # 0: keep the dataset's order
  # Read each split from shards_dir/<split>, written by `python -m
  # looper.shards write`, instead of calling dataset_fn (file mode).
  c.data.shards_dir = ""
  # File mode: the files are dealt into this many fixed groups; a global
  # batch takes train.batch_size / virtual_shards examples from each, so it
  # is the same on any topology whose replica count divides this.
  c.data.virtual_shards = 64
  c.data.cache = False  # file mode: keep parsed examples in memory
  # Element mode, examples whose inputs vary in length (a dimension of
  # unknown size): a global batch takes examples of one length bucket and
  # is padded to it, a multiple of this many; at most max length / bucket
  # shapes (XLA programs). 0: every example has one static shape.
  c.data.bucket = 0

  # A SavedModel for serving (any batch size) in workdir/export/<step>:
  # --mode=export does it for a checkpoint; at_end after training.
  c.export = ml_collections.ConfigDict()
  c.export.at_end = False

  # A profiler trace of train steps start_step+1 .. start_step+num_steps in
  # workdir/train/plugins/profile/, for TensorBoard's Profile tab (with the
  # tensorboard-plugin-profile package). 0: no trace.
  c.profile = ml_collections.ConfigDict()
  c.profile.start_step = 0
  c.profile.num_steps = 5

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
  if value.startswith(UNLOADABLE):
    raise ConfigError(
        f"config.{field}={value!r} was saved from an object that cannot be"
        f" loaded back; set config.{field} in get_config() to a module-level"
        " function or a 'module:name' string")
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


# Files loaded by `_import`, by real path.
_FILES: dict[str, types.ModuleType] = {}


def _import(module: str):
  """Imports a module by dotted name, or a config file by its .py path.

  A file runs at most once per process, like an imported module: its top
  level may load data or have side effects, and every field naming it must
  get the same objects. A file Python already loaded (imported as a module,
  or by config_flags as the --config file) is reused, not run again.
  """
  if not module.endswith(".py"):
    return importlib.import_module(module)
  path = os.path.realpath(module)
  if path not in _FILES:
    loaded = _loaded_from(path)
    if loaded is None:
      spec = importlib.util.spec_from_file_location(
          os.path.splitext(os.path.basename(module))[0], module)
      loaded = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(loaded)  # cached only if it ran to the end
    _FILES[path] = loaded
  return _FILES[path]


def _loaded_from(path: str) -> types.ModuleType | None:
  """A module in sys.modules that was loaded from the file at `path`."""
  for module in list(sys.modules.values()):
    # vars(), not getattr: a lazy module (TensorFlow's) would import itself
    # on a missing attribute.
    file = vars(module).get("__file__") if isinstance(
        module, types.ModuleType) else None
    # Names first: realpath touches the disk, and TensorFlow brings
    # thousands of modules.
    if (isinstance(file, str) and
        os.path.basename(file) == os.path.basename(path) and
        os.path.realpath(file) == path):
      return module
  return None


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


def _whole(value: Any) -> bool:
  """An int that is not a bool (True would silently mean 1)."""
  return isinstance(value, int) and not isinstance(value, bool)


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
              ("train.grad_accum_steps", c.train.grad_accum_steps),
              ("eval.batch_size", c.eval.batch_size),
              ("checkpoint.keep", c.checkpoint.keep),
              ("distribution.num_cpu_devices",
               c.distribution.num_cpu_devices),
              ("data.virtual_shards", c.data.virtual_shards),
              ("optimizer.reference_batch_size",
               c.optimizer.reference_batch_size),
              ("profile.num_steps", c.profile.num_steps)]
  for field, value in positive:
    _check(_whole(value) and value >= 1, field, value,
           f"must be a whole number >= 1; set --config.{field}")
  for field, value in [("eval.every_steps", c.eval.every_steps),
                       ("distribution.tpu_cores", c.distribution.tpu_cores),
                       ("checkpoint.every_steps", c.checkpoint.every_steps),
                       ("data.shuffle_buffer", c.data.shuffle_buffer),
                       ("data.bucket", c.data.bucket),
                       ("optimizer.warmup_steps", c.optimizer.warmup_steps),
                       ("train.nan_recovery_tries",
                        c.train.nan_recovery_tries),
                       ("train.early_stop_patience",
                        c.train.early_stop_patience),
                       ("profile.start_step", c.profile.start_step)]:
    _check(_whole(value) and value >= 0, field, value,
           f"must be a whole number >= 0; set --config.{field}")
  _check(c.profile.start_step < c.train.steps, "profile.start_step",
         c.profile.start_step, f"must be < train.steps={c.train.steps}: the"
         " trace holds the steps after it; set --config.profile.start_step")
  _check(c.eval.steps is None or c.eval.steps >= 1, "eval.steps",
         c.eval.steps, "must be >= 1, or None for the whole eval split")
  _check(c.optimizer.learning_rate > 0, "optimizer.learning_rate",
         c.optimizer.learning_rate, "must be > 0")
  _check(c.optimizer.warmup_steps <= c.train.steps, "optimizer.warmup_steps",
         c.optimizer.warmup_steps, f"must be <= train.steps={c.train.steps}")
  _check(isinstance(c.distribution.worker_timeout_secs, (int, float)) and
         c.distribution.worker_timeout_secs > 0,
         "distribution.worker_timeout_secs", c.distribution.worker_timeout_secs,
         "must be a number of seconds > 0")
  for field, value in [("checkpoint.every_secs", c.checkpoint.every_secs),
                       ("eval.timeout_secs", c.eval.timeout_secs)]:
    _check(isinstance(value, (int, float)) and value >= 0, field, value,
           f"must be a number of seconds >= 0; set --config.{field}")
  for field, value in [("data.cache", c.data.cache),
                       ("train.jit_compile", c.train.jit_compile),
                       ("optimizer.scale_lr_with_batch",
                        c.optimizer.scale_lr_with_batch),
                       ("export.at_end", c.export.at_end)]:
    _check(isinstance(value, bool), field, value,
           f"must be True or False; set --config.{field}")
  _check_choice(c.checkpoint.best_mode, "checkpoint.best_mode", BEST_MODES)
  _check(not c.train.early_stop_patience or bool(c.checkpoint.best_metric),
         "train.early_stop_patience", c.train.early_stop_patience,
         "early stopping watches checkpoint.best_metric; set"
         " --config.checkpoint.best_metric (e.g. accuracy)")
  _check_choice(c.optimizer.name, "optimizer.name", OPTIMIZERS)
  _check_choice(c.train.precision, "train.precision", precision.PRECISIONS)
  _check(isinstance(c.optimizer.ema_decay, (int, float)) and
         0 <= c.optimizer.ema_decay < 1, "optimizer.ema_decay",
         c.optimizer.ema_decay, "must be in [0, 1), e.g. 0.999 (0: off)")
  _check(isinstance(c.optimizer.clip_global_norm, (int, float)) and
         c.optimizer.clip_global_norm >= 0, "optimizer.clip_global_norm",
         c.optimizer.clip_global_norm, "must be a number >= 0 (0: no clipping)")
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
  if callable(value):
    return _loadable_name(value) or f"{UNLOADABLE}{_describe(value)}>"
  return value


def _loadable_name(value: Any) -> str | None:
  """The 'module:name' string `resolve` turns back into `value`, if any."""
  module_name = getattr(value, "__module__", None)
  qualname = getattr(value, "__qualname__", None)  # None on instances
  if not (isinstance(module_name, str) and isinstance(qualname, str)):
    return None
  # '<lambda>', 'f.<locals>.g': no attribute path reaches them.
  if "<" in qualname:
    return None
  module = sys.modules.get(module_name)
  top_level = module_name.split(".")[0]
  importable = (top_level in sys.builtin_module_names or
                importlib.machinery.PathFinder.find_spec(top_level) is not None)
  if importable and _attribute(module, qualname) is value:
    return f"{module_name}:{qualname}"
  # Defined in a file loaded by path: by config_flags (under a private module
  # name that no other process can import) or by `resolve`. Name the file.
  for module in [module, *_FILES.values()]:
    file = vars(module).get("__file__") if module is not None else None
    if isinstance(file, str) and _attribute(module, qualname) is value:
      return f"{os.path.relpath(file)}:{qualname}"
  return None  # e.g. a bound method, or a name rebound since


def _attribute(obj: Any, dotted: str) -> Any:
  for part in dotted.split("."):
    obj = getattr(obj, part, None)
  return obj


def _describe(value: Any) -> str:
  """A stable description of a callable for a reader; no memory addresses."""
  if isinstance(value, functools.partial):
    args = [_describe_arg(a) for a in value.args]
    args += [f"{k}={_describe_arg(v)}" for k, v in value.keywords.items()]
    return f"functools.partial({', '.join([_describe_arg(value.func)] + args)})"
  qualname = getattr(value, "__qualname__", None)
  if isinstance(qualname, str):
    kind = ("class" if inspect.isclass(value) else
            "method" if inspect.ismethod(value) else "function")
    return f"{kind} {getattr(value, '__module__', '?')}:{qualname}"
  cls = type(value)
  return f"instance of {cls.__module__}:{cls.__qualname__}"


def _describe_arg(value: Any) -> str:
  if callable(value):
    return _loadable_name(value) or _describe(value)
  return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def to_json(c: ml_collections.ConfigDict) -> str:
  """The resolved config as JSON, with callables written as strings.

  A callable that `resolve` can load back (a module-level function or class)
  becomes 'module:name', or 'path/to/file.py:name' for one defined in a config
  file loaded by path. Any other callable (a lambda, a nested function, a
  functools.partial, a bound method, a callable instance such as
  `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`) becomes
  '<unloadable: DESCRIPTION>', where DESCRIPTION is for a reader, e.g.
  '<unloadable: functools.partial(mod:fn, from_logits=True)>' or
  '<unloadable: instance of mod:Class>'. `resolve` rejects such a string with
  a one-line error. Saving never fails on a callable.
  """
  return json.dumps(_jsonable(c.to_dict()), indent=2, sort_keys=True)


def check_metric_names(names) -> None:
  """Checks the names of the built metric objects (they key the logs).

  Called once the metrics are built, since factories choose their names.

  Args:
    names: the `.name` of every metric, in config.metrics order.

  Raises:
    ConfigError: a name is one looper logs itself, or is used twice.
  """
  seen = set()
  for name in names:
    if name in RESERVED_METRIC_NAMES:
      raise ConfigError(
          f"config.metrics: a metric is named {name!r}, which looper reports"
          " itself; give it another name (e.g. keras.metrics.Mean("
          f"name='my_{name}'))")
    if name in seen:
      raise ConfigError(
          f"config.metrics: two metrics are named {name!r}, so one would"
          " hide the other in the logs; give each its own name")
    seen.add(name)


def override_error(exc: BaseException, argv) -> str:
  """Turns ml_collections' multi-line 'no such field' error into one line.

  Args:
    exc: what parsing a `--config.x.y=v` flag raised.
    argv: the command line, to name the flag that caused it.
  """
  text, bad, flag = _override_flag(exc, argv)
  flag = flag or f"--config...{bad}"
  suggestion = re.search(r'Did you mean "([\w.]+)"', text)
  head, _, tail = flag.rpartition(bad)
  hint = (f"did you mean {head}{suggestion.group(1)}{tail}?"
          if suggestion else "run with --helpfull to list the config fields")
  return f"{flag}: the config has no field {bad!r}; {hint}"


def _override_flag(exc: BaseException, argv):
  """(exc's text, the key it names, the --config.* flag with that key)."""
  text = str(exc).replace("\\n", "\n").replace("\\'", "'")
  key = re.search(r"""^['"]*(?:Key ")?([\w.]+)""", text)
  bad = key.group(1) if key else "?"
  flag = next((a.split("=")[0] for a in argv[1:]
               if a.startswith("--config.") and
               re.search(rf"\.{re.escape(bad)}(\.|=|$)", a.split("=")[0])),
              None)
  return text, bad, flag


def parse_error(exc: BaseException, argv
                ) -> tuple[str, types.TracebackType | None]:
  """Explains a KeyError/AttributeError raised while the flags were parsed.

  Two different errors arrive as these types. ml_collections raises one for
  a --config.* override that names no field: a typo, for which one line is
  best. The --config file's own code raises one too, e.g. os.environ['X'] in
  get_config(): a bug in the file, for which the traceback is what helps. It
  is an override error only if no frame of the traceback runs the config
  file and the key it names is in a --config.* flag.

  Args:
    exc: what `flags.FLAGS(argv)` raised.
    argv: the command line.

  Returns:
    (the one line to end with, the traceback to print before it or None).
  """
  path = _config_file_arg(argv)
  in_file = exc.__traceback__
  while in_file is not None and (
      path is None or os.path.realpath(in_file.tb_frame.f_code.co_filename)
      != os.path.realpath(path)):
    in_file = in_file.tb_next
  if in_file is None and _override_flag(exc, argv)[2]:
    return override_error(exc, argv), None
  # Printed from the config file's first frame on: absl's and
  # ml_collections' frames above it would only hide the user's line.
  return (f"--config={path}: loading the config file raised {exc!r}; see the"
          " traceback above", in_file or exc.__traceback__)


def _config_file_arg(argv) -> str | None:
  """The path in --config=PATH[:ARG] (or --config PATH), if given."""
  for i, arg in enumerate(argv[1:], 1):
    if arg == "--":
      break
    match = re.match(r"^--?config(?:=(.*))?$", arg)
    if match:
      value = match.group(1) if "=" in arg else (
          argv[i + 1] if i + 1 < len(argv) else None)
      # config_flags passes what follows the first ':' to get_config().
      return value.split(":", 1)[0] if value else None
  return None


def parse_flags(argv):
  """absl's parser (`app.run(..., flags_parser=)`), config errors in one line."""
  try:
    return flags.FLAGS(argv)
  except ConfigError as e:
    sys.exit(f"looper: {e}")
  except (AttributeError, KeyError) as e:  # an override, or the config file
    _exit_with(e, argv)
  except flags.Error as e:
    # ml_collections re-raises a TypeError/ValueError of the config file
    # (e.g. `c.train.steps = "100"`) as text; the original is its context.
    wrapper = e.__context__
    if (wrapper is not None and wrapper.__context__ is not None and
        str(wrapper).startswith("Error whilst parsing config file")):
      _exit_with(wrapper.__context__, argv)
    sys.exit(f"looper: {e}")


def _exit_with(e: BaseException, argv):
  line, trace = parse_error(e, argv)
  if trace is not None:  # the config file's own bug: show where
    traceback.print_exception(type(e), e, trace)
  sys.exit(f"looper: {line}")
