"""looper: fast, exact, distributed custom training loops on TensorFlow 2.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist

Modules, one concept each: `config` (defaults, validation), `distribute`
(strategies), `data` (batching, sharding, padding, resume), `trainer` (the
Trainer and its loops), `optimizers`, `checkpoint`, `summaries`, `run` (the
outer loop) and `main` (the command line).
"""

__version__ = "0.1.0"
