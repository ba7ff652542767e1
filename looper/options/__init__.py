"""The options a config chooses, each with its name table and builder.

Synopsis::

    from looper.options import losses, metrics, optimizers, precision
    optimizer = optimizers.build(config.optimizer, total_steps, batch_size)
    with precision.policy(config.train.precision):
      model = model_fn(config)
    strategy = distribute.strategy_for(config.distribution)

| module | owns |
|---|---|
| `distribute` | `distribution.*`: the strategy (one device, Mirrored, multi-worker, TPU) |
| `cluster` | TF_CONFIG's tasks, the coordination leader, the task's id, a TPU's cores and batch per core |
| `slurm` | a Slurm step's tasks as one multi-worker cluster: TF_CONFIG, ports, each task's GPUs |
| `precision` | `train.precision`: the Keras policy, loss scaling, op determinism, the finiteness checks |
| `optimizers` | `optimizer.*`: the optimizer and its schedule, clipping after the replicas' sum |
| `ema` | `optimizer.ema_decay`: the weight average eval and export use |
| `losses` | `loss`, `loss_normalization`, `loss_weights`: per-example losses and the global-batch average |
| `metrics` | `metrics`: replicated Keras metrics keyed by their log names |
| `keras_objects` | a user's Keras loss and metric objects as looper runs them |
| `best` | `checkpoint.best_metric`/`best_mode`: which evaluation is a run's best |

`distribute`, `optimizers`, `losses` and `metrics` declare their config
blocks (`config()`) and check them against their tables (`check`);
looper.config composes them. These rank above the floor; they know
nothing of the data, the workdir or the loop (tests/test_layout.py).
"""
