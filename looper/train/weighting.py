"""How an update's examples weigh in its loss: `Weighting`.

Synopsis (what the Trainer builds from its loss blocks; its seams
`micro_batches`, `weight_total` and `average_loss` call it)::

    weighting = Weighting(config.loss, config.loss_normalization,
                          config.loss_weights, class_weights=None,
                          batch=batch)
    micro = weighting.micro_batches(batch)     # [(inputs, labels, weights)]
    total = weighting.total([w for _, _, w in micro])  # or None
    loss = weighting.average(values, weights, total)   # this replica's share

An update is `batch.accum_steps` micro-batches of `batch.per_replica`
examples on each replica, concatenated (looper.data.batch). Each
example's weight is its own (the data's third element) times its class's
(data.class_weights), 0 on a Keras loss object's ignore_class. The loss of
a micro-batch on a replica is its share of the global batch's mean: summed
over replicas and micro-batches it is the mean over the update's examples
(loss_normalization 'batch_size'), or over their weights ('weights': the
weight total is one scalar all-reduce per step), with each output's loss
times its loss_weights factor (looper.options.losses.average).
"""

import tensorflow as tf

from looper import autograph
from looper.data import batch as batch_lib
from looper.options import keras_objects
from looper.options import losses


class Weighting:
  """The weights and the average of an update's loss (see module doc).

  Args:
    loss: config.loss (a name, a function, a Keras loss, or a dict of them
      by output): its reduction and ignore_class, if a Keras object.
    normalization: config.loss_normalization (a loss object's reduction
      may decide it: looper.options.keras_objects).
    loss_weights: config.loss_weights, a factor per output (None: 1).
    class_weights: data.class_weights (None: off).
    batch: the run's batch numbers (looper.data.batch.Batch).
  """

  def __init__(self, loss, normalization: str, loss_weights, *,
               class_weights=None, batch: batch_lib.Batch):
    self.normalization = keras_objects.normalization(loss, normalization)
    self.ignored = keras_objects.ignore_class(loss)  # a label of weight 0
    self._table = losses.class_weight_table(class_weights)  # by class id
    self._loss_weights, self._batch = loss_weights, batch

  @autograph.plain
  def micro_batches(self, batch) -> list:
    """A replica's `batch` cut back into its micro-batches (static
    slices), each as (inputs, labels, weights); weights None if there are
    none."""
    rows = self._batch.per_replica
    parts = []
    for i in range(self._batch.accum_steps):
      inputs, labels, weights = batch_lib.parts(tf.nest.map_structure(
          lambda t, i=i: t[i * rows:(i + 1) * rows], batch))
      parts.append((inputs, labels, losses.label_weighted(
          weights, labels, self._table, self.ignored)))
    return parts

  @autograph.plain
  def total(self, weights: list):
    """The sum of an update's example weights (each micro-batch's, a list)
    over all replicas, which normalization 'weights' divides by; None
    when not needed."""
    if self.normalization != "weights" or weights[0] is None:
      return None
    local = tf.nest.map_structure(
        lambda *w: tf.add_n([tf.reduce_sum(x) for x in w]), *weights)
    return tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, local)

  @autograph.plain
  def average(self, values, weights=None, total=None):
    """This replica's share of the global batch's loss from per-example
    (or per-token) `values`, weighted by `weights` out of `total`."""
    return losses.average(
        values, weights, total, loss_weights=self._loss_weights,
        normalization=self.normalization,
        global_batch_size=self._batch.global_batch_size)
