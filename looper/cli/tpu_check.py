"""`looper check`: will this experiment compile and feed on a TPU? (on a CPU)

Synopsis::

    looper check --config=experiments/mnist.py [--cores=8]
    python -m looper.main --config=... --mode=check --cores=32

    problems = tpu_check.check(config, cores=8)   # [] means ready

Prints "ready: ..." and exits 0, or one line per problem (naming the layer
or op, or the dataset field, and the fix) and exits 1. What it checks, each
a rule of the TPU guides ("XLA rules"):
  1. the train step and the eval forward pass trace with every shape static
     (a Python `if` on a tensor value cannot, rule 1) and every op has a
     static output shape (`tf.where(x)`, `tf.unique`, `tf.boolean_mask`:
     data-dependent shapes, rule 2);
  2. both compile with XLA (`jit_compile=True`, run once on a per-core batch):
     an op without an XLA kernel is named;
  3. the first `batches` train batches have few distinct shapes (rule 3:
     each new shape is a new compilation on a TPU);
  4. the input pipelines are pure tf.data (`py_function`, `numpy_function`
     and `from_generator` run Python, which a TPU host cannot);
  5. the global batch splits over `cores` into a multiple of 8 per core;
  6. no float64 tensor and no int64 label (TPUs emulate both slowly);
  7. no mixed_float16 (a TPU computes in bfloat16: mixed_bfloat16).
A precision slower than float32 on the machine running the check (e.g.
mixed_bfloat16 on a CPU without bfloat16 instructions) is noted under
the verdict.
Everything runs on the host's CPU with the default strategy, whatever
`distribution.strategy` says: no TPU is needed, none is contacted.

The XLA CPU compiler accepts dynamic shapes a TPU rejects, so rule 2 is
checked on the traced graph, not by compiling.
"""

import dataclasses
import os
import re
import sys
import traceback

import tensorflow as tf

from looper import compat
from looper import config as config_lib
from looper import errors
from looper import references
from looper.data import batch as batch_lib
from looper.data import checks
from looper.data import input as input_lib
from looper.data import splits
from looper.options import cluster
from looper.options import precision
from looper.run import pieces

# Distinct train batch shapes above which a TPU run spends its time
# compiling (rule 3).
MAX_SHAPES = 8


def check(config, *, cores: int = 8, batches: int = 20,
          notes: list[str] | None = None) -> list[str]:
  """Returns the problems an experiment would meet on `cores` TPU cores.

  Args:
    config: the experiment's config (not changed).
    cores: TPU cores of the target (8: a v2-8/v3-8 or one v4-8 host).
    batches: train batches whose shapes are looked at.
    notes: if given, gets what the run cannot promise but is no problem
      (random draws that depend on the replica count), for `report`.
  """
  config_lib.validate(config)
  # Traced here, on the CPU's default strategy (one replica), whatever the
  # config asks for; the steps are compiled below one at a time
  # (train.jit_compile only affects the train loop, which is not run).
  strategy = tf.distribute.get_strategy()
  batch = batch_lib.of(config.train, config.eval,
                       strategy.num_replicas_in_sync)
  problems = _batch_problems(batch, cores) + _precision_problems(config)
  if problems:  # the per-core batch is needed by everything below
    return problems
  per_core = dataclasses.replace(batch, replicas=cores)  # splits: checked
  trainer_cls = references.resolve(config.trainer, "trainer")
  data = input_lib.Input(config.data, strategy, batch, seed=config.seed,
                         dataset_fn=references.bound(config, "dataset_fn"))
  # The optimizer's schedule needs the steps train.epochs come to.
  config, _ = config_lib.resolve_epochs(config, data, known=False)
  trainer = pieces.trainer(config, strategy, data, batch,
                           steps_per_loop=config.train.steps_per_loop,
                           cls=trainer_cls)
  if notes is not None and trainer.random.note():
    notes.append(trainer.random.note())
  read = [config.data.train_split, *splits.eval_sets(config).values()]
  try:
    examples = {split: data.examples(split) for split in read}
  except errors.ConfigError as e:  # e.g. examples of dynamic shape
    return problems + [str(e)]
  for split, dataset in examples.items():
    problems += _dtype_problems(dataset.element_spec, split)
    problems += _python_in_pipeline(dataset, split,
                                    splits.split_field(config, split))
  ctx = tf.distribute.InputContext(1, 0, cores)  # one core's batches
  source = data.source(config.data.train_split)
  try:  # e.g. file mode: the files must split over the cores
    source.check(cores, per_core.micro_batch_size, "train.batch_size")
  except errors.ConfigError as e:
    return problems + [str(e)]
  train = source.train(ctx, batch_size=per_core.micro_batch_size,
                       seed=config.seed,
                       shuffle_buffer=config.data.shuffle_buffer, position=0)
  # One pipeline feeds all the cores: `cores` batches per global batch.
  shapes, first = _shapes(train, batches * cores, config.data.train_split)
  if isinstance(shapes, str):
    return problems + [shapes]
  if len(shapes) > MAX_SHAPES:
    problems.append(
        f"config.dataset_fn: the first {batches} train batches have"
        f" {len(shapes)} distinct shapes (e.g. {sorted(shapes)[:3]}); each"
        f" compiles again on a TPU: raise --config.data.bucket so fewer"
        f" padded lengths remain (see experiments/text_classifier.py)")
  inputs, labels, weights = batch_lib.parts(first)
  # padded_batch: variable-length examples (data.bucket) batch too.
  eval_inputs = next(iter(examples[read[-1]].padded_batch(
      per_core.eval_per_replica, drop_remainder=True)))[0]
  steps = {
      "train step": (trainer.compute_gradients, (inputs, labels) if
                     weights is None else (inputs, labels, weights)),
      "eval step": (lambda x: trainer.model(x, training=False),
                    (eval_inputs,)),
  }
  # A broken layer breaks both steps: one line naming both.
  broken = {}
  for name, (fn, args) in steps.items():
    problem = _compile_problem(fn, args)
    if problem:
      broken.setdefault(problem, []).append(name)
  return problems + [
      f"config.model_fn ({' and '.join(names)}): {problem}"
      for problem, names in broken.items()]


def _batch_problems(batch: batch_lib.Batch, cores: int) -> list[str]:
  """Each batch size that does not split over the cores, and a per-core
  batch off the TPU's tiles (what Batch would refuse, all of it)."""
  problems = []
  for field, size in (("train.batch_size", batch.micro_batch_size),
                      ("eval.batch_size", batch.eval_batch_size)):
    if size % cores:
      good = cores * max(1, round(size / cores))
      problems.append(
          f"config.{field}={size} does not split over {cores} TPU cores; set"
          f" --config.{field}={good}")
  warning = cluster.tpu_batch_warning(batch.micro_batch_size, cores)
  if warning and not problems:
    problems.append(warning)
  return problems


def _precision_problems(config) -> list[str]:
  if config.train.precision != "mixed_float16":
    return []
  return ["config.train.precision='mixed_float16' is for GPUs: a TPU computes"
          " in bfloat16, where float16's loss scaling only costs; set"
          " --config.train.precision=mixed_bfloat16"]


def _dtype_problems(element_spec, split: str) -> list[str]:
  problems = []
  for path, spec in [leaf for name, part in zip(
      ("inputs", "labels", "weights"), element_spec)
                     for leaf in _leaves(part, name)]:
    if spec.dtype == tf.float64:
      problems.append(
          f"config.dataset_fn: {path} of split {split!r} is float64, which a"
          f" TPU emulates slowly; cast it to float32 in dataset_fn")
    elif spec.dtype == tf.int64 and path.startswith("labels"):
      problems.append(
          f"config.dataset_fn: {path} of split {split!r} are int64, which a"
          f" TPU handles poorly; cast them to int32 in dataset_fn")
  return problems


def _leaves(structure, name: str) -> list:
  """[(name['key'][0], leaf)] of a nest of dicts, tuples and leaves."""
  if isinstance(structure, dict):
    items = structure.items()
  elif isinstance(structure, (tuple, list)):
    items = enumerate(structure)
  else:
    return [(name, structure)]
  return [leaf for key, value in items
          for leaf in _leaves(value, f"{name}[{key!r}]")]


def _python_in_pipeline(dataset, split: str, field: str) -> list[str]:
  """Ops that call back into Python, anywhere in the dataset's graph."""
  found = checks.python_calls(checks.ops_in(dataset))
  if not found:
    return []
  return [f"config.dataset_fn: split {split!r} ({field}) runs Python through"
          f" {' and '.join(sorted(found))}, which a TPU host cannot; build the"
          f" pipeline from tf.data and tf ops only (or write shards: python -m"
          f" looper.cli.shards write)"]


def _shapes(dataset, batches: int, split: str):
  """The distinct (inputs, labels) shapes of the first batches, and batch 1;
  or one problem line if the examples do not even batch."""
  shapes, first = set(), None
  try:
    for batch in dataset.take(batches):
      first = first or batch
      shapes.add(str(tf.nest.map_structure(lambda t: t.shape.as_list(),
                                           batch)))
  except tf.errors.InvalidArgumentError as e:
    return (f"config.dataset_fn: the examples of split {split!r} do not form"
            f" batches ({errors.first_line(e)}); give them one shape in"
            f" dataset_fn, or set --config.data.bucket to pad variable"
            f" lengths"), None
  return shapes, first


def _compile_problem(fn, args) -> str | None:
  """Traces `fn` on static shapes, then compiles and runs it with XLA;
  returns what is wrong (to follow "the train step"), or None."""
  specs = tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype), args)
  try:
    graph = tf.function(fn).get_concrete_function(*specs).graph
  except tf.errors.OperatorNotAllowedInGraphError as e:
    return (f"a Python if/while/bool() reads a tensor's value at"
            f" {_user_frame(e)}; a TPU program is fixed when traced:"
            f" use tf.cond, tf.where or keras.ops.cond")
  dynamic = _dynamic_op(graph)
  if dynamic:
    return (f"op {dynamic} has a data-dependent output shape, which a TPU"
            f" cannot compile; use fixed-size ops (masks, tf.where(cond, x,"
            f" y), padding) instead")
  try:
    tf.function(fn, jit_compile=True)(*args)
  except tf.errors.InvalidArgumentError as e:
    op = errors.xla_op(e)
    if op is None:
      raise
    return (f"op {op} does not compile with XLA (no XLA kernel; TPUs run"
            f" only XLA); replace it in the model")
  return None


def _dynamic_op(graph) -> str | None:
  """The first op whose output shape is unknown though its inputs' are not,
  as 'Type (name)', searching nested function bodies (while loops) too."""
  known = lambda ts: all(t.shape.rank is not None and
                         None not in t.shape.as_list() for t in ts)
  for op in graph.get_operations():
    # Inputless ops (a function body's placeholders) have no data to
    # depend on; their shapes are the caller's, checked where it is.
    # Arithmetic on static shapes and constants (a gradient's
    # BroadcastGradientArgs of two shapes) folds into a constant in XLA.
    if (op.inputs and op.outputs and known(op.inputs) and
        not known(op.outputs) and not all(_folds(t, {}) for t in op.inputs)):
      return f"{op.type} ({op.name})"
  for body in compat.function_graphs(graph):
    found = _dynamic_op(body)
    if found:
      return found
  return None


def _folds(tensor, memo: dict) -> bool:
  """Whether `tensor` is computed from constants and static shapes alone."""
  op = tensor.op
  if op.name not in memo:
    memo[op.name] = False  # a cycle (a loop's back edge) does not fold
    if op.type == "Const":
      memo[op.name] = True
    elif op.type in ("Shape", "ShapeN", "Size", "Rank"):
      memo[op.name] = all(t.shape.is_fully_defined() for t in op.inputs)
    elif op.inputs and tensor.dtype.is_integer:
      memo[op.name] = all(_folds(t, memo) for t in op.inputs)
  return memo[op.name]


def _user_frame(error: Exception) -> str:
  """file:line of the innermost frame outside TensorFlow, Keras and looper
  where a traced function failed: from the message where AutoGraph wrote
  one ("in user code: File ..., line N"), else from the traceback (looper's
  loop is not converted: a model's call fails in plain Python)."""
  skip = tuple(os.path.dirname(m.__file__) for m in
               (tf, sys.modules.get("keras", tf), sys.modules["looper"]))
  def users(frames):
    return [(path, line) for path, line in frames
            if not path.startswith(skip) and "site-packages" not in path]
  frames = users(re.findall(r'File "([^"]+)", line (\d+)', str(error))) or (
      users((frame.filename, frame.lineno)
            for frame in traceback.extract_tb(error.__traceback__)))
  if not frames:
    return "an unknown place"
  path, line = frames[-1]
  return f"{os.path.basename(path)}:{line}"


def report(problems: list[str], config, cores: int, notes=()) -> str:
  """The text `looper check` prints: 'ready: ...' or the problems, then
  `notes` (from `check`) and a note if the precision is slower than
  float32 on this machine."""
  if problems:
    text = "\n".join(f"looper check: {p}" for p in problems)
  else:
    batch = batch_lib.of(config.train, config.eval, cores)
    text = (f"ready: the train and eval steps compile with XLA on static"
            f" shapes, the input is pure tf.data, batch"
            f" {batch.micro_batch_size} = {batch.per_replica} per core on"
            f" {cores} TPU cores")
  text += "".join(f"\nnote: {note}" for note in notes)
  accelerated = any(tf.config.list_physical_devices(kind)
                    for kind in ("GPU", "TPU"))
  slower = precision.slower_here(config.train.precision,
                                 accelerated=accelerated)
  if slower:
    text += (f"\nnote: train.precision={config.train.precision} on this"
             f" machine: {slower}")
  return text
