"""The outer loop: when train loops, evaluations and saves run, and what stops them.

| module | owns |
|---|---|
| `controller`, `surfaces` | the outer loop and the modes, the NaN and spike roll-back (no TensorFlow); the Protocols of what it drives |
| `actions` | what runs between loops and when (`Action`, `Moment`) |
| `standard_actions` | the actions every run gets (summaries, progress, eval, checkpoint, export, goodput), each made from its collaborators |
| `eval_action` | evaluation as an action: eval events, the best checkpoint, early stop |
| `callbacks`, `callback_state`, `keras_views` | Keras callbacks as `fit` calls them, their state in the checkpoint, and the model and optimizer as they see them |
| `spikes` | a loss spike against the recent steps' median (`train.spike_factor`) |
| `epochs` | train.epochs and every_epochs as steps, from the train split's size (`resolve`, `Epoch`) |
| `signals`, `vm_notices` | signals and GCE preemption notices that ask the loop to stop |
| `profiler` | the profiler window (`profile.*`): an action whose edges end loops |

Imports `looper.train` (the loop it drives) and `looper.measure`, never
the reverse: the step knows nothing of when it runs.
"""
