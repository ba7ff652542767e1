"""The training loop: the Trainer, its loop and evaluation, and when things run.

| module | owns |
|---|---|
| `trainer` | the `Trainer`: state built in scope, the seams a subclass overrides |
| `loop` | `TrainLoop`: K replica steps in one tf.function, the loss buffer |
| `evaluator` | `Evaluator`: one exact pass over the eval split, the weight-average swap |
| `controller` | the outer loop and the modes (no TensorFlow) |
| `epochs` | train.epochs and every_epochs as steps, from the train split's size (`resolve`, `Epoch`) |
| `actions` | what runs between loops and when (`Action`, `Moment`) |
| `evaluation` | evaluation as an action: eval events, the best checkpoint (`Best`), early stop |
| `stopping`, `preemption`, `notices` | a stop request agreed across workers; signals and GCE preemption notices that ask for one |
| `goodput` | where each training attempt's time went (`Ledger`), across restarts (`Totals`) |
| `distribute`, `optimizers`, `precision`, `objectives` | the options: each owns its name table |
| `slurm` | a Slurm step's tasks as one multi-worker cluster: TF_CONFIG, ports, each task's GPUs |
| `ema`, `layers`, `dry_run` | the weight average; replica-invariant noise layers; the model and loss run on a split's first examples before a run |
| `randomness` | Keras' own random layers: their state in the checkpoint, replica-invariant draws, the draws that are not named |
| `flops`, `peak` | a train step's FLOPs (counted once from its graph) and tokens; the peak FLOP/s MFU divides by (flag, datasheet, cached matmul probe) |
| `profiler` | the profiler window (`profile.*`): an action whose edges end loops |

Data come from `looper.data`; what is written goes through `looper.workdir`.
"""
