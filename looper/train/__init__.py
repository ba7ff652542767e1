"""The training loop: the Trainer, its loop and evaluation, and when things run.

| module | owns |
|---|---|
| `trainer` | the `Trainer`: state built in scope, the seams a subclass overrides |
| `loop` | `TrainLoop`: K steps of a replica step function in one tf.function, the loss buffer; no Trainer in it |
| `evaluator` | `Evaluator`: one exact pass over the eval split, the weight-average swap |
| `controller` | the outer loop and the modes, the NaN and spike roll-back (no TensorFlow) |
| `health`, `spikes` | per loop: the gradient's and weights' norms and the update ratio; a loss spike against the recent steps' median |
| `epochs` | train.epochs and every_epochs as steps, from the train split's size (`resolve`, `Epoch`) |
| `actions` | what runs between loops and when (`Action`, `Moment`) |
| `eval_action` | evaluation as an action: eval events, the best checkpoint, early stop |
| `standard_actions` | the actions every run gets (summaries, progress, eval, checkpoint, export, goodput), each made from its collaborators |
| `stopping`, `signals`, `vm_notices` | a stop request agreed across workers; signals and GCE preemption notices that ask for one |
| `goodput` | where each training attempt's time went (`Ledger`), across restarts (`Totals`) |
| `layers`, `dry_run` | replica-invariant noise layers; the model and loss run on a split's first examples before a run |
| `randomness` | Keras' own random layers: their state in the checkpoint, replica-invariant draws, the draws that are not named |
| `flops`, `peak_flops` | a train step's FLOPs (counted once from its graph) and tokens; the peak FLOP/s MFU divides by (flag, datasheet, cached matmul probes), raised by a loop above it |
| `profiler` | the profiler window (`profile.*`): an action whose edges end loops |

The options (losses, metrics, optimizers, precision, distribution) come
from `looper.options`, data from `looper.data`; what is written goes through `looper.workdir`.
"""
