"""The config every experiment inherits: its defaults, and `validate`.

Synopsis (an experiment file)::

    from looper import config as lc

    def model_fn(config): ...            # -> keras.Model returning logits
    def dataset_fn(config, split): ...   # -> tf.data.Dataset of (inputs, label)

    def get_config():
      c = lc.default_config()
      c.model_fn = model_fn              # or the string 'my.module:model_fn'
      c.dataset_fn = dataset_fn
      c.train.steps = 1000               # or c.train.epochs = 3
      c.model.width = lc.whole(128)      # the experiment's own, >= 1
      return c

A field with a kind is declared once with its default by `whole`,
`seconds` or `boolean` (its doc: the comment above it), looper's here, an
experiment's own in its get_config(); `validate` checks each declared field
("config.model.width=0: must be a whole number >= 2; set
--config.model.width"). Later assignments (`c.train.steps = 500`) keep the kind.

`validate` checks every field looper reads; an option's names come from
the table of the module that builds it (`distribute.STRATEGIES`,
`losses.LOSSES`, ..., `looper.trackers.TRACKERS` checked by the Run), so a
new option is added in one place. Every error is one line naming the
field, the value and the fix ("did you mean"), before TensorFlow runs.

Also here for experiments: the field kinds `whole`, `seconds`, `boolean`
(looper.fields), `ConfigError` and `first_line` (what their loaders raise,
and the line of a library error they quote) and the split helpers
`split_slice`, `parse_split`, `split_field` (looper.data.splits)."""

import difflib
from typing import Any

import ml_collections
from ml_collections import config_dict

from looper import fields
from looper import keras_compat
from looper import network
from looper import references
from looper.data import splits
from looper.options import best
from looper.options import distribute
from looper.options import keras_objects
from looper.options import losses
from looper.options import metrics
from looper.options import optimizers
from looper.options import precision
# Public names for experiments (see the module doc).
from looper.data.splits import parse_split, split_field, split_slice  # pylint: disable=unused-import
from looper.errors import ConfigError, first_line  # pylint: disable=unused-import
from looper.fields import Field, boolean, declared, seconds, whole  # pylint: disable=unused-import


# Lengths in steps or in epochs of the train split: (steps field, epochs
# field, what they set). One of each pair is set, the other 0 (no value is
# silently ignored); looper.control.epochs makes steps of epochs.
IN_EPOCHS = (("train.steps", "train.epochs", "how long to train"),
             ("eval.every_steps", "eval.every_epochs", "when to evaluate"),
             ("checkpoint.every_steps", "checkpoint.every_epochs",
              "when to save"))


def value_at(c: ml_collections.ConfigDict, path: str) -> Any:
  """The value of the field at dotted `path` ('train.steps')."""
  section, _, name = path.rpartition(".")
  return (c[section] if section else c)[name]


def default_config() -> ml_collections.ConfigDict:
  """Returns the defaults every experiment starts from (field by field)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The experiment: callables or 'module:function' strings (see module doc).
  c.model_fn = fields.object_field(None)
  c.dataset_fn = fields.object_field(None)
  # Trainer class to run; subclass looper.train.trainer.Trainer to change a step.
  c.trainer = fields.object_field("looper.train.trainer:Trainer")
  # Per-example (or per-token) loss on the model's logits: a name
  # (losses.LOSSES) or fn(labels, logits); for a model returning a dict
  # of outputs, a dict of them by output (labels: a dict, same keys).
  c.loss = fields.object_field("sparse_categorical_crossentropy")
  # Outputs: {output: factor} in the sum of their losses (missing: 1).
  c.loss_weights = fields.object_field(None)
  # How the global batch's weighted losses are averaged (losses.NORMALIZATIONS):
  # batch_size (Keras': by the number of loss values) | weights (by the sum
  # of the weights: masked per-token losses average over the real tokens).
  c.loss_normalization = "batch_size"
  # Metrics on logits, by name (metrics.METRICS) or zero-arg factories;
  # for outputs, a dict of such tuples by output (logged 'output/name').
  c.metrics = fields.object_field(("accuracy",))
  # The user's looper.Actions beside looper's (README "Hooks of your own"):
  # a list, or a factory f(config) returning one (or its 'module:name').
  c.actions = fields.object_field(())
  # Keras callbacks as fit() calls them: a list, or a factory as for actions.
  c.callbacks = fields.object_field(())  # (looper/control/callbacks.py)
  # Experiment trackers, each set up by its own environment variables:
  c.trackers = ""  # '' | mlflow | wandb | mlflow,wandb (README)

  c.train = ml_collections.ConfigDict()
  # How long to train: optimizer updates, or epochs of the train split
  # (a fraction too: 2.5), which looper.control.epochs turns into updates,
  # rounded up. Set one, the other 0 (IN_EPOCHS).
  c.train.steps = whole(0, low=0)
  c.train.epochs = fields.epochs()
  c.train.batch_size = whole(128)  # GLOBAL, split evenly over the replicas
  # Steps run inside one tf.function call; evaluation, checkpoints and the
  # end clamp a loop so they land exactly on their step.
  c.train.steps_per_loop = whole(100)
  # On a NaN/inf loss (or a spike): restore the last checkpoint, skip the data
  # that blew up and go on, at most this many times; 0 stops with an error.
  c.train.nan_recovery_tries = whole(0, low=0)
  # Roll back a loop whose top step loss > this x the recent median; 0: off.
  c.train.spike_factor = Field(0.0, float, "a factor", 1, above=True, off=0)
  c.train.health_metrics = boolean(True)  # grad/weight norms: measure/health.py
  # Stop after this many evals not bettering checkpoint.best_metric; 0: never.
  c.train.early_stop_patience = whole(0, low=0)
  # float32 | mixed_bfloat16 (TPU, CPU with AMX or AVX-512 BF16) |
  # mixed_float16 (GPU, with loss scaling): see looper/options/precision.py.
  c.train.precision = "float32"
  # XLA-compile each replica's forward and backward pass (not the loop).
  c.train.jit_compile = boolean(False)
  # Op determinism and no TF32 (GPU matmuls at float32, not 10-bit inputs): the
  # exact contracts on GPUs, at some speed; no input-wait timing; process-wide.
  c.train.deterministic = boolean(False)
  # Micro-batches of train.batch_size per optimizer update: the update of one
  # batch grad_accum_steps times larger (train.steps counts updates).
  c.train.grad_accum_steps = whole(1)
  # FLOP/s of a GPU or TPU device, or of a host's CPUs, MFU is the share of; 0:
  # a datasheet's (known GPU, TPU) or matmul probes', cached (measure/peak_flops.py).
  c.train.peak_flops = Field(0.0, float, "a number of FLOP/s")

  c.eval = ml_collections.ConfigDict()
  # Evaluate every this many steps, or epochs; both 0: only at the end of
  # training. Set one, the other 0 (IN_EPOCHS).
  c.eval.every_steps = whole(0, low=0)
  c.eval.every_epochs = fields.epochs()
  # GLOBAL batch; the last one is padded and masked.
  c.eval.batch_size = whole(256)
  c.eval.steps = config_dict.placeholder(int)  # None: the whole eval split.
  # --mode=continuous_eval stops after this long without a new checkpoint.
  c.eval.timeout_secs = seconds(3600)
  c.eval.monitor_set = ""  # the eval set callbacks see (looper.data.splits)

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adam"  # sgd | adam | adamw
  c.optimizer.learning_rate = 1e-3
  c.optimizer.schedule = "constant"  # constant | cosine | linear (to 0)
  # Linear warmup before the schedule: update k uses k/warmup_steps of it.
  c.optimizer.warmup_steps = whole(0, low=0)
  c.optimizer.momentum = 0.9  # sgd only
  c.optimizer.weight_decay = 0.0  # adamw only
  # Clip the global-batch gradient to this global norm (0: off); applied
  # after the replicas' sum, unlike Keras' clipnorm.
  c.optimizer.clip_global_norm = Field(0.0, float, "a norm")
  # Keep an exponential moving average of the weights with this decay
  # (e.g. 0.999; 0: off); eval and export use it. Checkpointed.
  c.optimizer.ema_decay = 0.0
  # Linear scaling (Goyal et al.): the rate used is learning_rate *
  # train.batch_size / reference_batch_size; pair it with warmup_steps.
  c.optimizer.scale_lr_with_batch = boolean(False)
  c.optimizer.reference_batch_size = whole(256)

  c.checkpoint = ml_collections.ConfigDict()
  # Save every this many steps, or epochs; both 0: only at the end (and on
  # a stop). Set one, the other 0 (IN_EPOCHS).
  c.checkpoint.every_steps = whole(0, low=0)
  c.checkpoint.every_epochs = fields.epochs()
  c.checkpoint.keep = whole(3)
  # Also save when this long has passed since the last save (0: off), so a
  # preemptible job loses at most this much work whatever the step time.
  c.checkpoint.every_secs = seconds(0)
  # Write checkpoints in a background thread (TensorFlow's async saving);
  # not `async`, a Python keyword (`c.checkpoint.async` would not parse).
  c.checkpoint.async_save = boolean(False)
  # Keep the checkpoint with the best value of this eval metric ('accuracy',
  # a set's 'val/accuracy', 'loss' with best_mode='min') in checkpoints/best/.
  c.checkpoint.best_metric = ""
  c.checkpoint.best_mode = "max"  # max | min
  # A training run holds workdir/lease.json while it writes (looper.workdir.lease):
  # a second writer is refused. A holder on another host that has not
  # renewed it (every lease_secs / 4) for this long is taken to be gone.
  c.checkpoint.lease_secs = seconds(60, positive=True)

  # Warm start (a workdir with no checkpoint): another run's weights first.
  c.init = ml_collections.ConfigDict()
  c.init.checkpoint = ""  # a checkpoint prefix or a checkpoints/ directory
  c.init.optimizer = boolean(False)  # also restore the optimizer slots

  c.distribution = ml_collections.ConfigDict()
  # auto, or one of distribute.STRATEGIES; auto picks from the fields below
  c.distribution.strategy = "auto"
  c.distribution.num_cpu_devices = whole(1)  # >1: split the CPU, mirror over it
  # ZeRO stage 1: 1/N of the optimizer's slots per replica (options/sharding)
  c.distribution.shard_optimizer = boolean(False)
  c.distribution.tpu = ""  # TPU name or grpc:// address ('local' on a VM)
  # Off a TPU: dry-run its start-up checks for this many cores (0: on a TPU)
  c.distribution.tpu_cores = whole(0, low=0)
  # multi_worker: how long a worker waits for the others to come up, and
  # how long one may stay unreachable later (missed heartbeats: a cut link,
  # a lost VM), before the others fail with one line naming it.
  c.distribution.worker_timeout_secs = seconds(300, positive=True)
  # multi_worker: how the workers sum gradients (distribute.ALL_REDUCES):
  # auto (NCCL between GPUs, else ring) | nccl | ring. Workers sharing a GPU
  # need ring: NCCL refuses them (`looper launch` sets it when they share).
  c.distribution.all_reduce = "auto"
  # multi_worker: who may reach this worker's server, which listens on every
  # address of the machine: network.REACHES (loopback | private | public),
  # checked before it starts. private fits TF_CONFIG's and Slurm's machines;
  # `looper launch` makes it loopback (its workers: 127.0.0.1) unless given.
  c.distribution.network = "private"

  c.data = ml_collections.ConfigDict()
  c.data.dir = ""  # where the experiment's dataset_fn reads its files
  c.data.train_split = "train"
  c.data.eval_split = "test"
  # Eval sets {name: split}, each exact, logged '<name>/<metric>' (see
  # looper.data.splits); replaces eval_split (leave it 'test' or '').
  c.data.eval_splits = fields.object_field(None)
  c.data.shuffle_buffer = whole(10_000, low=0)  # 0: keep the dataset's order
  # Read each split from shards_dir/<split>, written by `python -m
  # looper.cli.shards write`, instead of calling dataset_fn (file mode).
  c.data.shards_dir = ""
  # File mode: the files are dealt into this many fixed groups; a global
  # batch takes train.batch_size / virtual_shards examples from each, so it
  # is the same on any topology whose replica count divides this.
  c.data.virtual_shards = whole(64)
  c.data.cache = boolean(False)  # file mode: keep parsed examples in memory
  # Element mode, examples whose inputs vary in length (a dimension of
  # unknown size): a global batch takes examples of one length bucket and
  # is padded to it, a multiple of this many; at most max length / bucket
  # shapes (XLA programs). 0: every example has one static shape.
  c.data.bucket = whole(0, low=0)
  # Train-time weight of each class id, multiplied into the examples' own
  # sample weights: a sequence by class id, or a dict {id: weight} (others
  # 1). Empty: off. Eval is not rebalanced (as in Keras).
  c.data.class_weights = fields.object_field(())
  # Train from the tf.data service with this dispatcher (looper.data.service).
  c.data.service = ""  # HOST:PORT; '': the train input runs here
  c.data.service_timeout_secs = seconds(60, positive=True)  # wait at start

  # A SavedModel for serving (any batch size) in workdir/export/<step>:
  # --mode=export does it for a checkpoint; at_end after training.
  c.export = ml_collections.ConfigDict()
  c.export.at_end = boolean(False)

  # A profiler trace of train steps start_step+1 .. start_step+num_steps in
  # workdir/train/plugins/profile/, for TensorBoard's Profile tab (with the
  # tensorboard-plugin-profile package). 0: no trace.
  c.profile = ml_collections.ConfigDict()
  c.profile.start_step = whole(0, low=0)
  c.profile.num_steps = whole(5)

  c.model = ml_collections.ConfigDict()  # the experiment's own fields
  return c


def _check(ok: bool, field: str, value: Any, fix: str):
  if not ok:
    raise ConfigError(f"config.{field}={value!r}: {fix}")


def _check_choice(value: Any, field: str, choices, also: str = "") -> None:
  """`value` must be one of `choices` (a table's keys); else one line with
  the nearest name (and `also`, another way to set the field)."""
  choices = list(choices)
  if value not in choices:
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"config.{field}={value!r} is not one of {', '.join(choices)};"
        f" {hint}set --config.{field}{also}")


def _validate_objectives(c: ml_collections.ConfigDict) -> None:
  """config.loss, loss_weights, loss_normalization, metrics, and
  data.class_weights: names from objectives' tables, one shape."""
  outputs = isinstance(c.loss, dict)
  for field, loss in (c.loss.items() if outputs else [(None, c.loss)]):
    name = "loss" if field is None else f"loss['{field}']"
    _check(callable(loss) or isinstance(loss, str), name, loss,
           "give a loss name or a fn(labels, logits) -> per-example loss"
           " (or a dict of them by output name)")
    if isinstance(loss, str):
      _check_choice(loss, name, losses.LOSSES,
                    ", or assign a fn(labels, logits) in get_config()")
  if c.loss_weights is not None:
    _check(outputs and isinstance(c.loss_weights, dict) and
           set(c.loss_weights) <= set(c.loss) and
           all(fields.number(v) and v >= 0 for v in c.loss_weights.values()),
           "loss_weights", c.loss_weights,
           "give {output: factor >= 0} for outputs config.loss names (a dict"
           " by output), or None")
  _check_choice(c.loss_normalization, "loss_normalization",
                losses.NORMALIZATIONS)
  keras_objects.check_loss(c.loss, c.loss_normalization,
                           class_weighted=bool(c.data.class_weights))
  _check(isinstance(c.metrics, dict) == outputs or not c.metrics, "metrics",
         c.metrics, "give a dict of metric tuples by output when config.loss"
         " is a dict by output, else a tuple" if outputs else
         "give a tuple of metric names, e.g. ('accuracy',): config.loss is"
         " not a dict by output")
  for output, entries in (c.metrics.items() if isinstance(c.metrics, dict)
                          else [(None, c.metrics)]):
    name = "metrics" if output is None else f"metrics['{output}']"
    _check(isinstance(entries, (tuple, list)), name, entries,
           "give a tuple of metric names, e.g. ('accuracy',)")
    for metric in entries:
      _check(callable(metric) or isinstance(metric, str), name, entries,
             "give metric names, Keras metric objects or zero-argument"
             " factories of them")
      if isinstance(metric, str):
        _check_choice(metric, name, metrics.METRICS,
                      ", or add a metric factory in get_config()")
  # Built once here, their variables never made: what they log under,
  # and that each object rebuilds from its config (looper makes fresh
  # copies), fail now, not in the first trace.
  with keras_compat.keras_variables_deferred():
    metrics.Metrics(c.metrics)
  weights = c.data.class_weights
  values = list(weights.values()) if isinstance(weights, dict) else weights
  _check(isinstance(weights, (dict, tuple, list)) and
         all(fields.number(v) and 0 <= v < float("inf") for v in values) and
         (not isinstance(weights, dict) or
          all(str(k).isdigit() for k in weights)),
         "data.class_weights", weights,
         "give a weight >= 0 per class id: a sequence (1.0, 5.0) or a dict"
         " {1: 5.0}")
  _check(not (weights and outputs), "data.class_weights", weights,
         "class weights need one class-id label; with a dict of outputs,"
         " weigh examples by a third element of each example instead")


def validate(c: ml_collections.ConfigDict) -> None:
  """Checks every field looper reads, and every declared field (looper's
  and the experiment's); raises ConfigError on the first bad one."""
  for field in ("model_fn", "dataset_fn", "trainer"):
    _check(callable(references.resolve(c[field], field)), field, c[field],
           "must name a callable")
  _validate_objectives(c)
  for path, field in declared(c):
    value = field.get()
    _check(field.allows(value), path, value,
           f"must be {field.must}; set --config.{path}")
  for steps, epochs, what in IN_EPOCHS:
    if value_at(c, steps) and value_at(c, epochs):
      raise ConfigError(
          f"config.{steps}={value_at(c, steps)!r} and config.{epochs}="
          f"{value_at(c, epochs)!r} both set {what}; set one of them to 0:"
          f" --config.{steps}=0 to count in epochs, or --config.{epochs}=0")
  if not (c.train.steps or c.train.epochs):
    raise ConfigError(
        f"config.train.steps={c.train.steps!r} and config.train.epochs="
        f"{c.train.epochs!r}: nothing sets how long to train; set"
        " --config.train.steps (optimizer updates) or --config.train.epochs")
  # Steps from train.epochs are known once the data are: checked then.
  if c.train.steps:
    check_steps(c)
  _check(c.eval.steps is None or c.eval.steps >= 1, "eval.steps",
         c.eval.steps, "must be >= 1, or None for the whole eval split")
  _check(c.optimizer.learning_rate > 0, "optimizer.learning_rate",
         c.optimizer.learning_rate, "must be > 0")
  _check_choice(c.checkpoint.best_mode, "checkpoint.best_mode",
                best.BEST_MODES)
  _check(not c.train.early_stop_patience or bool(c.checkpoint.best_metric),
         "train.early_stop_patience", c.train.early_stop_patience,
         "early stopping watches checkpoint.best_metric; set"
         " --config.checkpoint.best_metric (e.g. accuracy, val/accuracy)")
  _check_choice(c.optimizer.name, "optimizer.name", optimizers.OPTIMIZERS)
  _check_choice(c.train.precision, "train.precision", precision.PRECISIONS)
  _check(isinstance(c.optimizer.ema_decay, (int, float)) and
         0 <= c.optimizer.ema_decay < 1, "optimizer.ema_decay",
         c.optimizer.ema_decay, "must be in [0, 1), e.g. 0.999 (0: off)")
  _check_choice(c.optimizer.schedule, "optimizer.schedule",
                optimizers.SCHEDULES)
  _check_choice(c.distribution.strategy, "distribution.strategy",
                ("auto", *distribute.STRATEGIES))
  _check_choice(c.distribution.all_reduce, "distribution.all_reduce",
                distribute.ALL_REDUCES)
  _check_choice(c.distribution.network, "distribution.network",
                network.REACHES)
  _check(c.distribution.strategy != "tpu" or bool(c.distribution.tpu),
         "distribution.tpu", c.distribution.tpu, "strategy 'tpu' needs the"
         " TPU name or address (use 'local' on a TPU VM)")
  parse_split(c.data.train_split, "data.train_split")
  splits.check_eval_sets(c, c.loss if isinstance(c.loss, dict) else ())


def check_steps(c: ml_collections.ConfigDict) -> None:
  """The fields bounded by train.steps; by `validate`, or by
  looper.control.epochs once it has turned train.epochs into steps."""
  _check(c.profile.start_step < c.train.steps, "profile.start_step",
         c.profile.start_step, f"must be < train.steps={c.train.steps}: the"
         " trace holds the steps after it; set --config.profile.start_step")
  _check(c.optimizer.warmup_steps <= c.train.steps, "optimizer.warmup_steps",
         c.optimizer.warmup_steps, f"must be <= train.steps={c.train.steps}")
