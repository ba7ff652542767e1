"""What TensorBoard's HParams tab shows: the settings that tell runs apart, and their results.

Synopsis (what `run` and `summaries` do)::

    table = hparams.Table.of(config_json, defaults_json, ["loss", "accuracy"])
    # or, with data.eval_splits: ["test/loss", ..., "val/accuracy"]
    with writer.as_default():                   # Workdir.hparams_events
      table.write_start(trial_id=workdir)          # once, at step 0
    table.eval_results(eval_logs, best_so_far)     # metric columns

One row per run, written in the run's own directory (`workdir/hparams/`):
* hparam columns: first each field `hparams_columns` names (a sweep's
  swept fields: `looper sweep` sets them, so every trial of a study writes
  the same list), then `learning rate`, `batch size`, `steps` (typed:
  sortable and filterable) and `settings`, one text of what else tells the run
  apart: the optimizer, schedule, precision and seed, then every config
  field the experiment or the command line set (those that differ from
  `default_config()`), as `name=value` (e.g. `optimizer.name=adam
  optimizer.schedule=cosine train.precision=float32 seed=0
  data.train_split=test[:8000] model.width=32`);
* metric columns: `hparams/eval_<metric>` (the last evaluation, the
  configured metrics first, then the loss; of each eval set in turn as
  `hparams/eval_<set>/<metric>`), `hparams/best_eval_<metric>`
  (by `looper.options.best.Best.of`) and `hparams/train_loss` (the last
  loop's mean):
  scalars written in the same directory as the run goes, so a single run
  has metric columns too.

Why this shape (measured on TensorBoard 2.21; BUILD.md "TensorBoard"):
* The web UI shows the first 5 hparam columns (those marked `differs`
  first) before any box is ticked, each 10em wide: with 5, the first
  metric column starts at the right edge of a 1400-pixel window (seen in
  a screenshot). So there are 4, and the eval accuracy is on screen.
* The plugin reads ONE experiment summary (the column list) per logdir,
  the first it finds; every run writes the same list, so whichever it
  picks fits every run of a sweep, of any experiment.
* The plugin attaches metrics only to runs under the session's directory;
  a session in the workdir root is a run named "." whose metrics it looks
  up as "./eval" and never finds. `hparams/` has a real name.
"""

import dataclasses
import json

import ml_collections

from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import api as hp
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata
from tensorboard.plugins.hparams import plugin_data_pb2
import tensorflow as tf

from looper import errors
from looper import references
from looper.data import splits
from looper.options import best

PREFIX = "hparams"  # of the metric columns' tags
# The typed columns, with their titles.
COLUMNS = {"optimizer.learning_rate": "learning rate",
           "train.batch_size": "batch size", "train.steps": "steps"}
SETTINGS = "settings"  # the text column
# An hparams_columns column's type, by its value's.
_TYPES = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
# First in `settings` whatever their value: what runs always differ by.
ALWAYS = ("optimizer.name", "optimizer.schedule", "train.precision", "seed")


def config() -> ml_collections.ConfigDict:
  """The top-level field `hparams_columns`: its default (its doc above)."""
  c = ml_collections.ConfigDict()
  # Config fields (comma separated, e.g. 'model.width,optimizer.name')
  # shown first as their own HParams columns (module doc); '' none.
  c.hparams_columns = ""
  return c


def columns(value: str) -> list[str]:
  """The field paths `hparams_columns` names, in order."""
  return [n.strip() for n in str(value).split(",") if n.strip()]


def check(value: str, config: ml_collections.ConfigDict) -> None:
  """Each of `hparams_columns` a field of `config` holding a number, a
  string or a boolean; one line naming it if not."""
  for path in columns(value):
    node = config
    for name in path.split("."):
      node = node.get(name) if isinstance(
          node, ml_collections.ConfigDict) else None
    if not isinstance(node, (bool, int, float, str)):
      raise errors.ConfigError(
          f"config.hparams_columns={value!r}: {path!r} is no field holding a"
          " number, string or boolean; name such fields (dotted, comma"
          " separated) in --config.hparams_columns")


def flat(config_json: str) -> dict[str, bool | int | float | str]:
  """The config as HParams: flat dotted names, scalars and strings only.

  Callables are already 'module:name' strings (`references.to_json`); the rest
  (None, tuples, callables no name reaches) has no HParams value and is
  left out: the config text holds it.
  """
  out = {}

  def visit(prefix, value):
    if isinstance(value, dict):
      for key, item in value.items():
        visit(f"{prefix}{key}.", item)
    elif isinstance(value, (bool, int, float, str)) and not (
        isinstance(value, str) and value.startswith(references.UNLOADABLE)):
      out[prefix[:-1]] = value

  visit("", json.loads(config_json))
  return out


def settings(config: dict, defaults: dict) -> str:
  """The `settings` text: ALWAYS, then the fields set (see module doc)."""
  chosen = [k for k in ALWAYS if k in config] + sorted(
      k for k, v in config.items()
      if k not in COLUMNS and k not in ALWAYS and
      (k not in defaults or defaults[k] != v))
  return " ".join(f"{k}={config[k]:g}" if isinstance(config[k], float)
                  else f"{k}={config[k]}" for k in chosen)


@dataclasses.dataclass
class Table:
  """One run's row of the HParams table (see module doc)."""
  values: dict[str, int | float | str]  # hparam column -> value
  eval_names: list[str]  # the eval metrics that are columns, loss last
  best: best.Best  # what `best_eval_<metric>` ranks by

  @classmethod
  def of(cls, config_json: str, defaults_json: str, eval_names) -> "Table":
    """The row of a run of `config_json` (resolved; see references.to_json)."""
    config, defaults = flat(config_json), flat(defaults_json)
    chosen = columns(config.get("hparams_columns", ""))
    values = {k: config[k] for k in [*chosen, *COLUMNS] if k in config}
    values[SETTINGS] = settings(
        {k: v for k, v in config.items()
         if k not in chosen and k != "hparams_columns"}, defaults)
    whole = json.loads(config_json)
    names = []
    for eval_set in splits.eval_sets(whole):  # each set's loss last
      prefix = splits.metric_name(eval_set, "")  # 'val/', or ''
      names += [n for n in eval_names if n.startswith(prefix) and
                n[len(prefix):] not in ("loss", "examples")]
      names.append(prefix + "loss")
    return cls(values, names, best.Best.of(whole.get("checkpoint", {}), names,
                                           splits.monitor_set(whole)))

  def metric_tags(self) -> list[str]:
    """The metric columns' scalar tags, in column order."""
    return ([f"{PREFIX}/eval_{n}" for n in self.eval_names] +
            [self.best_tag, self.train_loss_tag])

  @property
  def best_tag(self) -> str:
    return f"{PREFIX}/best_eval_{self.best.metric}"

  @property
  def train_loss_tag(self) -> str:
    return f"{PREFIX}/train_loss"

  def write_start(self, trial_id: str) -> None:
    """The session and the column list, with the default writer."""
    hp.hparams(self.values, trial_id=trial_id)
    typed = [k for k in self.values if k != SETTINGS]  # chosen first
    experiment = api_pb2.Experiment(
        hparam_infos=[api_pb2.HParamInfo(
            name=name, display_name=COLUMNS.get(name, name),
            type=_TYPES.get(type(self.values.get(name)),
                            api_pb2.DATA_TYPE_FLOAT64),
            differs=True)  # first, in this order (the plugin sorts by name)
                      for name in typed] + [
                          api_pb2.HParamInfo(
                              name=SETTINGS, type=api_pb2.DATA_TYPE_STRING)],
        metric_infos=[api_pb2.MetricInfo(
            name=api_pb2.MetricName(group="", tag=tag),
            display_name=tag.split("/", 1)[1].replace("_", " "))
                      for tag in self.metric_tags()])
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=metadata.EXPERIMENT_TAG, tensor=metadata.NULL_TENSOR,
        metadata=metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(experiment=experiment)))
    tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=0)

  def eval_results(self, logs: dict[str, float], best: float | None
                   ) -> dict[str, float]:
    """The metric columns after an evaluation, given the best so far of
    `self.best.metric` before it (None: none yet); includes the new best."""
    out = {f"{PREFIX}/eval_{n}": logs[n] for n in self.eval_names
           if n in logs}
    if self.best.metric in logs:
      value = logs[self.best.metric]
      best = value if self.best.better(value, best) else best
      if best is not None:  # None: only NaNs so far
        out[self.best_tag] = best
    return out
