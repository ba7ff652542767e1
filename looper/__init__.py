"""looper: fast, exact, distributed custom training loops on TensorFlow 2.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist

Where each concern lives (BUILD.md "Layout" maps every module):

    looper/
      main.py      the absl app: flags -> a mode (`looper.cli` for the tools)
      run.py       assembles a run from a config: strategy, Input, Trainer,
                   Evaluator, Checkpointer, actions, Controller
      config.py    the defaults and `validate` (fields declared once)
      console.py   the header and summary lines a run prints
      errors.py, names.py, compat.py, conversion.py   the floor: one-line
                   errors, 'module:name' references, private TF/Keras API
                   patches, AutoGraph for the user's code only
      cli/         the command line's tools (launch, runs, describe, check)
      data/        input: from dataset_fn to per-replica batches (`Input`)
      train/       the Trainer, its loop, evaluation, the Controller, options
      workdir/     what a run writes: checkpoints, lease, events, export
"""

__version__ = "0.1.0"
