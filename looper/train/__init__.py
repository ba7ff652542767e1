"""The step and its loop: the Trainer, the train loop, evaluation.

| module | owns |
|---|---|
| `trainer` | the `Trainer`: state built in scope, the seams a subclass overrides |
| `loop` | `TrainLoop`: K steps of a replica step function in one tf.function, the loss buffer; no Trainer in it |
| `evaluator` | `Evaluator`: one exact pass over the eval split, the weight-average swap |
| `stopping` | a stop request agreed across workers inside the loop (`StopFlag`) |
| `randomness`, `layers` | Keras' own random layers (their state in the checkpoint, replica-invariant draws); looper's replica-invariant noise layers |

When the loop runs and what runs between loops: `looper.control`; what a
step costs and how it went: `looper.measure`. The options (losses,
metrics, optimizers, precision, distribution) come from `looper.options`,
data from `looper.data`; what is written goes through `looper.workdir`.
"""
