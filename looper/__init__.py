"""looper: fast, exact, distributed custom training loops on TensorFlow 2.

Synopsis::

    python -m looper.main --config=experiments/mnist.py --workdir=/tmp/mnist

Modules, one concept each (BUILD.md "Layout" maps them all): `errors` (the
floor), `config` (defaults, validation), the option modules that own their
name tables (`distribute`, `optimizers`, `precision`, `objectives`), the
input package `data` (batching, sharding, padding, resume), `trainer` (the
Trainer and its loops) with `ema`, `stopping` and `probe`, `checkpoint`,
`summaries`, `actions` (what runs between loops, and when), `evaluation`
(eval, best checkpoint, early stop), `controller` (the outer loop and the
modes), `run` (assembly from a config) and `main` (the command line).
"""

__version__ = "0.1.0"
