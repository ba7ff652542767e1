"""The config every experiment inherits: its blocks composed, and `validate`.

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

Each block is declared beside the code that reads it, as torchtitan's
components declare theirs: its owner's `config()` holds each field, its
default and its doc (the comment above it), and its `check(block)` the
block's own rules. Here they are composed (`default_config`), in this order:

| fields | declared (and checked) in |
|---|---|
| seed, model_fn, dataset_fn, trainer, model | here: the experiment's |
| loss, loss_weights, loss_normalization | looper.options.losses |
| metrics | looper.options.metrics |
| actions, callbacks | looper.control.actions, looper.control.callbacks |
| trackers, trackers_group | looper.trackers (checked by the Run: `trackers.check`) |
| hparams_columns | looper.workdir.hparams |
| train | looper.train |
| eval | looper.train.evaluator |
| optimizer | looper.options.optimizers |
| checkpoint, init | looper.workdir.checkpoint, looper.workdir.contents |
| distribution | looper.options.distribute |
| data | looper.data.input |
| export, profile | looper.workdir.export, looper.control.profiler |

and the rules that span two blocks are kept here: a length in steps or in
epochs (IN_EPOCHS), the fields train.steps bounds (`check_steps`), early
stop and the best metric, class weights and a dict of outputs, the eval
sets and the monitor set. `resolve_epochs` makes steps of the epochs;
`differences` says where a run's config and a trained run's differ.

A field with a kind is declared once with its default by `whole`,
`seconds` or `boolean` (its doc: the comment above it), looper's in their
blocks, an experiment's own in its get_config(); `validate` checks each
declared field ("config.model.width=0: must be a whole number >= 2; set
--config.model.width"). Later assignments (`c.train.steps = 500`) keep the
kind. An option's names come from the table of the module that builds it
(`distribute.STRATEGIES`, `losses.LOSSES`, ...), so a new option is added
in one place. Every error is one line naming the field, the value and the
fix ("did you mean"), before TensorFlow runs.

Also here for experiments: the field kinds `whole`, `seconds`, `boolean`
(looper.fields), `ConfigError` and `first_line` (what their loaders raise,
and the line of a library error they quote) and the split helpers
`split_slice`, `parse_split`, `split_field` (looper.data.splits)."""

import copy
import json
import sys
from typing import Any

import ml_collections

from looper import fields
from looper import references
from looper import train
from looper import trackers
from looper.control import actions
from looper.control import callbacks
from looper.control import epochs
from looper.control import profiler
from looper.data import input as input_lib
from looper.data import splits
from looper.options import distribute
from looper.options import losses
from looper.options import metrics
from looper.options import optimizers
from looper.train import evaluator
from looper.workdir import checkpoint
from looper.workdir import contents
from looper.workdir import export
from looper.workdir import hparams
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

# Each block's own rules, by block: its owner's `check`.
CHECKS = {"train": train.check, "eval": evaluator.check,
          "optimizer": optimizers.check, "checkpoint": checkpoint.check,
          "distribution": distribute.check, "data": input_lib.check}


def value_at(c: ml_collections.ConfigDict, path: str) -> Any:
  """The value of the field at dotted `path` ('train.steps')."""
  section, _, name = path.rpartition(".")
  return (c[section] if section else c)[name]


def _top_level(c: ml_collections.ConfigDict,
               owned: ml_collections.ConfigDict) -> None:
  """Adds the top-level fields an owner declares (`owned`) to `c`, each
  as declared (a Field keeps its kind)."""
  for key, field in owned.items(preserve_field_references=True):
    c[key] = field


def default_config() -> ml_collections.ConfigDict:
  """Returns the defaults every experiment starts from (block by block)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The experiment: callables or 'module:function' strings (see module doc).
  c.model_fn = fields.object_field(None)
  c.dataset_fn = fields.object_field(None)
  # Trainer class to run; subclass looper.train.trainer.Trainer to change a step.
  c.trainer = fields.object_field("looper.train.trainer:Trainer")
  for owner in (losses, metrics, actions, callbacks, trackers, hparams):
    _top_level(c, owner.config())
  c.train = train.config()
  c.eval = evaluator.config()
  c.optimizer = optimizers.config()
  c.checkpoint = checkpoint.config()
  # Warm start (a workdir with no checkpoint): another run's weights first.
  c.init = contents.config()
  c.distribution = distribute.config()
  c.data = input_lib.config()
  # A SavedModel for serving (any batch size) in workdir/export/<step>:
  # --mode=export does it for a checkpoint; at_end after training.
  c.export = export.config()
  # A profiler trace of train steps start_step+1 .. start_step+num_steps in
  # workdir/train/plugins/profile/, for TensorBoard's Profile tab (with the
  # tensorboard-plugin-profile package). 0: no trace.
  c.profile = profiler.config()
  c.model = ml_collections.ConfigDict()  # the experiment's own fields
  return c


def validate(c: ml_collections.ConfigDict) -> None:
  """Checks every field looper reads, and every declared field (looper's
  and the experiment's); raises ConfigError on the first bad one."""
  for field in ("model_fn", "dataset_fn", "trainer"):
    fields.check(callable(references.resolve(c[field], field)), field,
                 c[field], "must name a callable")
  by_output = isinstance(c.loss, dict)
  losses.check(c.loss, c.loss_weights, c.loss_normalization,
               class_weighted=bool(c.data.class_weights))
  metrics.check(c.metrics, outputs=by_output)
  # Every declared field, the experiment's too, before a rule compares
  # two; each block's check repeats its own, so that it stands alone.
  fields.check_declared(c)
  for block, check in CHECKS.items():
    check(c[block])
  # The rules across blocks.
  fields.check(not (c.data.class_weights and by_output), "data.class_weights",
               c.data.class_weights, "class weights need one class-id label;"
               " with a dict of outputs, weigh examples by a third element of"
               " each example instead")
  for steps, epochs_field, what in IN_EPOCHS:
    if value_at(c, steps) and value_at(c, epochs_field):
      raise ConfigError(
          f"config.{steps}={value_at(c, steps)!r} and config.{epochs_field}="
          f"{value_at(c, epochs_field)!r} both set {what}; set one of them to"
          f" 0: --config.{steps}=0 to count in epochs, or"
          f" --config.{epochs_field}=0")
  if not (c.train.steps or c.train.epochs):
    raise ConfigError(
        f"config.train.steps={c.train.steps!r} and config.train.epochs="
        f"{c.train.epochs!r}: nothing sets how long to train; set"
        " --config.train.steps (optimizer updates) or --config.train.epochs")
  # Steps from train.epochs are known once the data are: checked then.
  if c.train.steps:
    check_steps(c)
  fields.check(not c.train.early_stop_patience or
               bool(c.checkpoint.best_metric), "train.early_stop_patience",
               c.train.early_stop_patience, "early stopping watches"
               " checkpoint.best_metric; set --config.checkpoint.best_metric"
               " (e.g. accuracy, val/accuracy)")
  splits.check_eval_sets(c.data, c.eval.monitor_set,
                         tuple(c.loss) if by_output else ())
  hparams.check(c.hparams_columns, c)  # names fields of any block


def check_steps(c: ml_collections.ConfigDict) -> None:
  """The fields bounded by train.steps; by `validate`, or by
  `resolve_epochs` once it has turned train.epochs into steps."""
  fields.check(c.profile.start_step < c.train.steps, "profile.start_step",
               c.profile.start_step, f"must be < train.steps={c.train.steps}:"
               " the trace holds the steps after it; set"
               " --config.profile.start_step")
  fields.check(c.optimizer.warmup_steps <= c.train.steps,
               "optimizer.warmup_steps", c.optimizer.warmup_steps,
               f"must be <= train.steps={c.train.steps}")


def resolve_epochs(c: ml_collections.ConfigDict, data: input_lib.Input, *,
                   known: bool = True, count: bool = False
                   ) -> tuple[ml_collections.ConfigDict, epochs.Epoch | None]:
  """(`c` with its epochs as steps, the train split's Epoch or None): what
  looper.control.epochs.resolve makes of `c`'s epochs fields (IN_EPOCHS),
  on `data` (the run's Input); `known`, `count`: as there.

  A config that sets an epochs field is copied (the caller's stays as
  asked, so it validates again) and the copy's steps twins are set; else
  it is returned as it is.

  Raises:
    ConfigError: the resolved train.steps is below what profile.start_step
      or optimizer.warmup_steps need (`check_steps`).
  """
  asked = {steps: value_at(c, epochs_field)
           for steps, epochs_field, _ in IN_EPOCHS
           if value_at(c, epochs_field)}
  steps, epoch = epochs.resolve(asked, data, split=c.data.train_split,
                                bucket=c.data.bucket, known=known,
                                count=count)
  if not steps:
    return c, epoch
  # Objects a config holds for the run (Keras callbacks) stay the caller's.
  kept = c.get("callbacks")
  resolved = copy.deepcopy(c, {id(kept): kept})
  resolved.update_from_flattened_dict(steps)
  check_steps(resolved)
  return resolved, epoch


def _differences(mine: dict, trained: dict, prefix: str = ""
                 ) -> dict[str, str]:
  """{field: 'field=value (config.json: value)'} of each field `mine`
  and `trained` (config.json) hold differently, by name."""
  found = {}
  for key in sorted(set(mine) | set(trained)):
    ours, theirs = mine.get(key), trained.get(key)
    if isinstance(ours, dict) and isinstance(theirs, dict):
      found.update(_differences(ours, theirs, f"{prefix}{key}."))
    elif ours != theirs:
      found[prefix + key] = (f"{prefix}{key}={json.dumps(ours)} (config.json:"
                             f" {json.dumps(theirs)})")
  return found


def differences(c: ml_collections.ConfigDict, trained: dict,
                argv: list[str] | None = None) -> str:
  """Where `c` (the run's, epochs resolved) and `trained` (a trained run's
  config.json, which an evaluator's header describes) differ, by where
  each value came from: the command line `argv` (default sys.argv; its
  --config.FIELD flags), derived by the run (the steps of an epochs field
  it sets: `resolve_epochs`), or the experiment file (a config from
  Python: the config given); '' if nowhere."""
  argv = sys.argv if argv is None else argv
  flags = {a[len("--config."):].split("=")[0] for a in argv
           if a.startswith("--config.")}
  derived = {steps for steps, epochs_field, _ in IN_EPOCHS
             if value_at(c, epochs_field)}
  rest = ("from the experiment file" if any(
      a == "--config" or a.startswith("--config=") for a in argv)
          else "in the config given")
  groups = {"on the command line": [], rest: [], "derived": []}
  for field, text in _differences(
      json.loads(references.to_json(c)), trained).items():
    given = field in flags or any(field.startswith(f + ".") for f in flags)
    where = ("derived" if field in derived else
             "on the command line" if given else rest)
    groups[where].append(text)
  return "; ".join(f"{where}: {', '.join(texts)}"
                   for where, texts in groups.items() if texts)
