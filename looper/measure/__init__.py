"""What a run measures: a step's FLOPs, the peak it is a share of, where time went, the update's health.

| module | owns |
|---|---|
| `flops`, `peak_flops` | a train step's FLOPs (counted once from its graph) and tokens; the peak FLOP/s MFU divides by (flag, datasheet, cached matmul probes), raised by a loop above it |
| `goodput` | where each training attempt's time went (`Ledger`), across restarts (`Totals`) |
| `health` | per loop: the gradient's and weights' norms and the update ratio |
| `dry_run` | the model and loss run on a split's first examples before a run |

Imports no other part of the training loop (`looper.train`,
`looper.control`): each figure is computed from what it is given.
"""
