"""Hyperparameter sweeps of looper runs on Optuna: `looper sweep` (README).

An experiment declares `get_sweep()` beside `get_config()`, with these:

    from looper import sweep
    sweep.Sweep(space={"optimizer.learning_rate": sweep.Float(1e-4, 0.3,
                log=True)}, objective="eval/accuracy")
"""

from looper.sweep.space import Categorical, Float, Int, Sweep  # pylint: disable=unused-import
