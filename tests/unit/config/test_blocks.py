"""The config's blocks, each declared and checked by its owner (issue 47):
composed, they hold the fields the one config.py held, each with its
default and kind; each block's check alone says what `validate` says."""

import ml_collections
from ml_collections import config_dict
import pytest

from looper import config as lc
from looper import fields
from looper import train
from looper.data import input as input_lib
from looper.options import distribute
from looper.options import losses
from looper.options import metrics
from looper.options import optimizers
from looper.train import evaluator
from looper.workdir import checkpoint
from tests.fixtures import tiny

# Every field of looper's default config as the single config.py declared
# them before the blocks moved to their owners (main at 7739d2e): path,
# default, and kind (a declared field's bound as its error words it, else
# the FieldReference's type or the plain value's); and those added since
# (hparams_columns, trackers_group: issue 48).
FIELDS = [
    ("actions", (), "object"),
    ("callbacks", (), "object"),
    ("checkpoint.async_save", False, "True or False"),
    ("checkpoint.best_metric", "", "str"),
    ("checkpoint.best_mode", "max", "str"),
    ("checkpoint.every_epochs", 0.0, "a number of epochs >= 0"),
    ("checkpoint.every_secs", 0.0, "a number of seconds >= 0"),
    ("checkpoint.every_steps", 0, "a whole number >= 0"),
    ("checkpoint.keep", 3, "a whole number >= 1"),
    ("checkpoint.lease_secs", 60.0, "a number of seconds > 0"),
    ("data.bucket", 0, "a whole number >= 0"),
    ("data.cache", False, "True or False"),
    ("data.class_weights", (), "object"),
    ("data.dir", "", "str"),
    ("data.eval_split", "test", "str"),
    ("data.eval_splits", None, "object"),
    ("data.service", "", "str"),
    ("data.service_timeout_secs", 60.0, "a number of seconds > 0"),
    ("data.shards_dir", "", "str"),
    ("data.shuffle_buffer", 10000, "a whole number >= 0"),
    ("data.train_split", "train", "str"),
    ("data.virtual_shards", 64, "a whole number >= 1"),
    ("dataset_fn", None, "object"),
    ("distribution.all_reduce", "auto", "str"),
    ("distribution.network", "private", "str"),
    ("distribution.num_cpu_devices", 1, "a whole number >= 1"),
    ("distribution.shard_optimizer", False, "True or False"),
    ("distribution.strategy", "auto", "str"),
    ("distribution.tpu", "", "str"),
    ("distribution.tpu_cores", 0, "a whole number >= 0"),
    ("distribution.worker_timeout_secs", 300.0, "a number of seconds > 0"),
    ("eval.batch_size", 256, "a whole number >= 1"),
    ("eval.every_epochs", 0.0, "a number of epochs >= 0"),
    ("eval.every_steps", 0, "a whole number >= 0"),
    ("eval.monitor_set", "", "str"),
    ("eval.steps", None, "int"),
    ("eval.timeout_secs", 3600.0, "a number of seconds >= 0"),
    ("export.at_end", False, "True or False"),
    ("hparams_columns", "", "str"),
    ("init.checkpoint", "", "str"),
    ("init.optimizer", False, "True or False"),
    ("loss", "sparse_categorical_crossentropy", "object"),
    ("loss_normalization", "batch_size", "str"),
    ("loss_weights", None, "object"),
    ("metrics", ("accuracy",), "object"),
    ("model_fn", None, "object"),
    ("optimizer.clip_global_norm", 0.0, "a norm >= 0"),
    ("optimizer.ema_decay", 0.0, "float"),
    ("optimizer.learning_rate", 0.001, "float"),
    ("optimizer.momentum", 0.9, "float"),
    ("optimizer.name", "adam", "str"),
    ("optimizer.reference_batch_size", 256, "a whole number >= 1"),
    ("optimizer.scale_lr_with_batch", False, "True or False"),
    ("optimizer.schedule", "constant", "str"),
    ("optimizer.warmup_steps", 0, "a whole number >= 0"),
    ("optimizer.weight_decay", 0.0, "float"),
    ("profile.num_steps", 5, "a whole number >= 1"),
    ("profile.start_step", 0, "a whole number >= 0"),
    ("seed", 0, "int"),
    ("trackers", "", "str"),
    ("trackers_group", "", "str"),
    ("train.batch_size", 128, "a whole number >= 1"),
    ("train.deterministic", False, "True or False"),
    ("train.early_stop_patience", 0, "a whole number >= 0"),
    ("train.epochs", 0.0, "a number of epochs >= 0"),
    ("train.grad_accum_steps", 1, "a whole number >= 1"),
    ("train.grad_norm", False, "True or False"),
    ("train.health_metrics", True, "True or False"),
    ("train.jit_compile", False, "True or False"),
    ("train.nan_recovery_tries", 0, "a whole number >= 0"),
    ("train.peak_flops", 0.0, "a number of FLOP/s >= 0"),
    ("train.precision", "float32", "str"),
    ("train.spike_factor", 0.0, "0 (off) or a factor > 1"),
    ("train.steps", 0, "a whole number >= 0"),
    ("train.steps_per_loop", 100, "a whole number >= 1"),
    ("trainer", "looper.train.trainer:Trainer", "object"),
]
BLOCKS = ["checkpoint", "data", "distribution", "eval", "export", "init",
          "model", "optimizer", "profile", "train"]


def _fields(c: ml_collections.ConfigDict, prefix: str = ""):
  """(path, default, kind) of each field of `c`, nested blocks too."""
  for key, value in c.items(preserve_field_references=True):
    if isinstance(value, ml_collections.ConfigDict):
      yield from _fields(value, f"{prefix}{key}.")
    elif isinstance(value, fields.Field):
      yield prefix + key, value.get(), value.must
    elif isinstance(value, config_dict.FieldReference):
      yield prefix + key, value.get(), value.get_type().__name__
    else:
      yield prefix + key, value, type(value).__name__


def test_the_composed_blocks_hold_every_field_as_one_config_did():
  c = lc.default_config()
  got = list(_fields(c))
  assert got == FIELDS
  # Same values and kinds, not just equal ones (0 is not 0.0, nor False).
  assert [(type(v), type(d)) for (_, v, _), (_, d, _) in zip(got, FIELDS)
          ] == [(type(d), type(d)) for _, d, _ in FIELDS]
  assert sorted(k for k, v in c.items()
                if isinstance(v, ml_collections.ConfigDict)) == BLOCKS
  assert not c.model  # the experiment's own, empty


@pytest.mark.parametrize("check,block,field,value", [
    (optimizers.check, optimizers.config, "name", "adm"),
    (optimizers.check, optimizers.config, "learning_rate", 0.0),
    (optimizers.check, optimizers.config, "ema_decay", 1.0),
    (optimizers.check, optimizers.config, "warmup_steps", -1),
    (distribute.check, distribute.config, "strategy", "tpu"),
    (distribute.check, distribute.config, "network", "privat"),
    (checkpoint.check, checkpoint.config, "best_mode", "maximum"),
    (checkpoint.check, checkpoint.config, "keep", 0),
    (train.check, train.config, "precision", "fp8"),
    (train.check, train.config, "steps_per_loop", 0),
    (evaluator.check, evaluator.config, "steps", 0),
    (input_lib.check, input_lib.config, "train_split", "train[:x]"),
    (input_lib.check, input_lib.config, "class_weights", (1.0, -2.0)),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_block_checks_itself_as_validate_does(check, block, field,
                                                   value):
  name = {optimizers.config: "optimizer", distribute.config: "distribution",
          checkpoint.config: "checkpoint", train.config: "train",
          evaluator.config: "eval", input_lib.config: "data"}[block]
  check(block())  # its defaults pass
  alone = block()
  alone[field] = value
  with pytest.raises(lc.ConfigError) as by_block:
    check(alone)
  whole = tiny.get_config()
  whole[name][field] = value
  with pytest.raises(lc.ConfigError) as by_validate:
    lc.validate(whole)
  assert str(by_block.value) == str(by_validate.value)
  assert str(by_block.value).startswith(f"config.{name}.")


def test_the_top_level_fields_check_themselves_as_validate_does():
  for change, check in [
      ({"loss": "mse"}, lambda c: losses.check(
          c.loss, c.loss_weights, c.loss_normalization)),
      ({"loss_normalization": "tokens"}, lambda c: losses.check(
          c.loss, c.loss_weights, c.loss_normalization)),
      ({"metrics": ("acuracy",)}, lambda c: metrics.check(c.metrics)),
      ({"metrics": {"digit": ("accuracy",)}},
       lambda c: metrics.check(c.metrics, outputs=False))]:
    c = tiny.get_config()
    c.update(change)
    with pytest.raises(lc.ConfigError) as by_owner:
      check(c)
    with pytest.raises(lc.ConfigError) as by_validate:
      lc.validate(c)
    assert str(by_owner.value) == str(by_validate.value)
