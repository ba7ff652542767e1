"""What the optimizer's state holds on each device, as built: the header's memory line.

Synopsis::

    optimizer_state.per_device(strategy, update, average)  # bytes, the most
                                                           # any device holds
    optimizer_state.held(strategy, variables)   # {device: [(name, dtype,
                                                #   shape), ...]}

Read from the variables' per-device components (what the strategy built),
never from the config: a sharded update (looper.options.sharding) holds a
slice of each slot on each device, a replicated one the whole; a silent
fallback shows here. `--verbosity=1` logs each device's list, which the
multi-worker test sums.
"""

from absl import logging
import keras
import tensorflow as tf


def held(strategy: tf.distribute.Strategy, variables) -> dict[str, list]:
  """(name, dtype, shape) of each component of `variables`, by device."""
  where = {}
  for variable in variables:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    for part in strategy.experimental_local_results(value):
      where.setdefault(part.device, []).append(
          (getattr(variable, "path", variable.name), part.dtype, part.shape))
  return where


def state_bytes(strategy: tf.distribute.Strategy, variables) -> dict[str, int]:
  """Bytes of `variables` on each device, from their components."""
  return {device: sum(s.num_elements() * d.size for _, d, s in parts)
          for device, parts in held(strategy, variables).items()}


def per_device(strategy: tf.distribute.Strategy, update, average=None) -> int:
  """The optimizer's state on the device holding most, in bytes: its
  variables (slots, step, a loss scale), the weight shards of a Sharded
  `update` and the weight average (`average`, its `.average(decay)`);
  `--verbosity=1` logs what each device of this process holds, as built."""
  variables = [*update.optimizer.variables, *getattr(update, "shards", []),
               *(average.averages if average else [])]
  for device, parts in held(strategy, variables).items():
    logging.vlog(1, "optimizer state on %s: %s", device, "; ".join(
        f"{name} {dtype.name}[{','.join(map(str, shape))}]"
        for name, dtype, shape in parts))
  return max(state_bytes(strategy, variables).values(), default=0)
