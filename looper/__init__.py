"""looper: fast, exact, distributed custom training loops on TensorFlow 2.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist

    from looper import Trainer, Action        # what an experiment uses
    class MyTrainer(Trainer):                  # config.trainer = MyTrainer
      def compute_loss(self, labels, logits): ...

Where each concern lives (BUILD.md "Layout" maps every module):

    looper/
      main.py      the absl app: flags -> a mode (`looper.cli` for the tools)
      run.py       assembles a run from a config (`Run`) and runs a mode
      config.py    the defaults and `validate` (fields declared once)
      console.py   the header and summary lines a run prints
      errors.py, references.py, compat.py, autograph.py, fields.py   the
                   floor: one-line errors, 'module:name' references and
                   config JSON, private TF/Keras API patches, AutoGraph for
                   the user's code only, config field kinds
      options/     what a config chooses: distribution, precision,
                   optimizers, losses, metrics, the best evaluation
      data/        input: from dataset_fn to per-replica batches (`Input`)
      train/       the Trainer, its loop, evaluation, the Controller
      workdir/     every path and every write: checkpoints, lease, writers
      trackers/    experiment trackers (MLflow, W&B), exact across restarts
      cli/         the command line's tools (launch, runs, describe, check)

The names below (PUBLIC) load on first use, so `import looper` starts no
TensorFlow (`looper launch` and the Controller need none). A module that
moved keeps working under its old path with a FutureWarning naming the new
one (MOVED); one that was split fails in one line naming both (SPLIT).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# What an experiment or a Trainer subclass imports from `looper`.
PUBLIC = {
    "Trainer": "looper.train.trainer",
    "Action": "looper.train.actions",
    "Moment": "looper.train.actions",
    "default_config": "looper.config",
    "ConfigError": "looper.errors",
}

# Old module path -> where it lives now (every layout looper had).
MOVED = {
    "looper.trainer": "looper.train.trainer",
    "looper.loop": "looper.train.loop",
    "looper.controller": "looper.train.controller",
    "looper.actions": "looper.train.actions",
    "looper.evaluator": "looper.train.evaluator",
    "looper.evaluation": "looper.train.eval_action",
    "looper.train.evaluation": "looper.train.eval_action",
    "looper.stopping": "looper.train.stopping",
    "looper.preemption": "looper.train.signals",
    "looper.train.preemption": "looper.train.signals",
    "looper.train.notices": "looper.train.vm_notices",
    "looper.train.peak": "looper.train.peak_flops",
    "looper.profiler": "looper.train.profiler",
    "looper.probe": "looper.train.dry_run",
    "looper.layers": "looper.train.layers",
    "looper.distribute": "looper.options.distribute",
    "looper.train.distribute": "looper.options.distribute",
    "looper.train.slurm": "looper.options.slurm",
    "looper.precision": "looper.options.precision",
    "looper.train.precision": "looper.options.precision",
    "looper.optimizers": "looper.options.optimizers",
    "looper.train.optimizers": "looper.options.optimizers",
    "looper.ema": "looper.options.ema",
    "looper.train.ema": "looper.options.ema",
    "looper.train.keras_objects": "looper.options.keras_objects",
    "looper.names": "looper.references",
    "looper.refs": "looper.references",
    "looper.conversion": "looper.autograph",
    "looper.arrays": "looper.data.arrays",
    "looper.sources": "looper.data.sources",
    "looper.checkpoint": "looper.workdir.checkpoint",
    "looper.export": "looper.workdir.export",
    "looper.hparams": "looper.workdir.hparams",
    "looper.jsonl": "looper.workdir.jsonl",
    "looper.lease": "looper.workdir.lease",
    "looper.summaries": "looper.workdir.summaries",
    "looper.launch": "looper.cli.launch",
    "looper.runs": "looper.cli.runs",
    "looper.describe": "looper.cli.describe",
    "looper.flag_errors": "looper.cli.parsing",
    "looper.preflight": "looper.cli.tpu_check",
}

# Old module path -> the modules its parts went to.
SPLIT = {
    "looper.objectives": "looper.options.losses (losses, their average,"
                         " EvalLoss) and looper.options.metrics (Metrics)",
}
SPLIT["looper.train.objectives"] = SPLIT["looper.objectives"]


def __getattr__(name: str):
  if name in PUBLIC:
    return getattr(importlib.import_module(PUBLIC[name]), name)
  raise AttributeError(f"module 'looper' has no attribute {name!r}")


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports an old path (MOVED) as its module under the new one."""

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name in MOVED or name in SPLIT:
      return importlib.util.spec_from_loader(name, self)
    return None

  def create_module(self, spec):
    if spec.name in SPLIT:
      raise ImportError(f"{spec.name} was split; import {SPLIT[spec.name]}")
    warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; import that",
                  FutureWarning, stacklevel=2)
    module = importlib.import_module(MOVED[spec.name])
    self._spec = module.__spec__  # the import system overwrites it next
    return module

  def exec_module(self, module):
    module.__spec__ = self._spec  # the module stays its own, not an alias


sys.meta_path.append(_OldPaths())
