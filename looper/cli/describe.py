"""`looper describe`: what a config would run, without training.

Synopsis::

    looper describe --config=experiments/mnist.py \
        --config.distribution.num_cpu_devices=4
    print(describe.describe(config))   # the same text, from Python

Prints the strategy and its replicas, the global and per-replica batch, the
loop and its cadence (the steps in epochs too), each split's input mode,
example spec and size, the model summary and the resolved config (epochs
as steps: looper.control.epochs; a Keras object by its class and
arguments). It builds the strategy and the Trainer exactly as a run does
(so a bad config fails with the run's one-line error) but reads no
checkpoint and writes nothing.
"""

from looper import config as config_lib
from looper import console
from looper import references
from looper.data import batch as batch_lib
from looper.data import input as input_lib
from looper.options import distribute
from looper.options import optimizer_state
from looper.run import pieces
from looper.workdir import summaries


def describe(config) -> str:
  """The description of `config` as text (see module doc)."""
  config_lib.validate(config)
  strategy = distribute.strategy_for(config.distribution)
  batch = batch_lib.of(config.train, config.eval,
                       strategy.num_replicas_in_sync)
  data = input_lib.Input(config.data, strategy, batch, seed=config.seed,
                         dataset_fn=references.bound(config, "dataset_fn"))
  # Its splits are counted anyway: the header says what the steps are in
  # epochs in element mode too.
  config, epoch = config_lib.resolve_epochs(config, data, count=True)
  trainer = pieces.trainer(config, strategy, data, batch,
                           steps_per_loop=config.train.steps_per_loop)
  lines = [console.header(
      strategy, None, "describe", None, trainer.model, batch, config.train,
      config.eval, config.checkpoint, config.distribution, epoch=epoch,
      note=trainer.random.note(),
      state=optimizer_state.per_device(strategy, trainer.update,
                                       trainer.ema)), "", "data"]
  for split in (config.data.train_split, *data.eval_sets.values()):
    field = data.field(split)
    source = data.source(split)
    size = data.size(split)  # element mode: counted by one pass
    inputs, labels, weights = batch_lib.parts(
        data.examples(split).element_spec)
    weighted = "" if weights is None else f", weights {_spec(weights)}"
    lines.append(f"  {field}={split!r}: {size:,} examples, {source.mode} mode;"
                 f" inputs {_spec(inputs)}, labels {_spec(labels)}{weighted}")
  lines += ["", "model", summaries.model_summary(trainer.model), "",
            "config", references.to_json(config, marked=False)]
  return "\n".join(lines)


def _spec(structure) -> str:
  """'float32[28, 28, 1]', or a dict of them."""
  if isinstance(structure, dict):
    return "{" + ", ".join(f"{k!r}: {_spec(v)}"
                           for k, v in structure.items()) + "}"
  if isinstance(structure, (tuple, list)):
    return "(" + ", ".join(_spec(v) for v in structure) + ")"
  dims = ", ".join("?" if d is None else str(d) for d in structure.shape)
  return f"{structure.dtype.name}[{dims}]"
