"""looper: fast, exact, distributed custom training loops on TensorFlow 2.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist

Modules, one concept each: `config` (defaults, validation), `distribute`
(strategies, cluster waits), `data` (batching, sharding, padding, resume),
`trainer` (the Trainer and its loops), `optimizers`, `checkpoint`,
`summaries`, `actions` (what runs between loops, and when), `evaluation`
(eval, best checkpoint, early stop), `preemption` (stop on a signal),
`controller` (the outer loop and the modes), `run` (assembly from a config)
and `main` (the command line).
"""

__version__ = "0.1.0"
