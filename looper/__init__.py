"""looper: fast, exact, distributed custom training loops on TensorFlow 2.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist

    from looper import Trainer, Action        # what an experiment uses
    class MyTrainer(Trainer):                  # config.trainer = MyTrainer
      def compute_loss(self, labels, logits): ...

Where each concern lives (BUILD.md "Layout" maps every module):

    looper/
      main.py      the absl app: flags -> a mode (`looper.cli` for the tools)
      run/         assembles a run from a config (`Run`) and runs a mode
      config.py    the blocks composed (each declared by its owner), `validate`
      console.py   the header and summary lines a run prints
      errors.py, references.py, compat.py, keras_compat.py, autograph.py,
      fields.py    the floor: one-line errors, 'module:name' references and
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
TensorFlow (`looper launch` and the Controller need none). Modules moved
in 0.x keep no old path (CHANGELOG.md says where each went).
"""

import importlib

__version__ = "0.1.0"

# What an experiment or a Trainer subclass imports from `looper`.
PUBLIC = {
    "Trainer": "looper.train.trainer",
    "Action": "looper.control.actions",
    "Moment": "looper.control.actions",
    "default_config": "looper.config",
    "ConfigError": "looper.errors",
}


def __getattr__(name: str):
  if name in PUBLIC:
    return getattr(importlib.import_module(PUBLIC[name]), name)
  raise AttributeError(f"module 'looper' has no attribute {name!r}")
