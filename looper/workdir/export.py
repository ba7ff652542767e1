"""Export for serving: a SavedModel whose batch dimension is free.

Synopsis::

    # After training (or any checkpoint) of a workdir:
    python -m looper.main --config=experiments/imdb_lstm.py \
        --workdir=/tmp/imdb --mode=export [--checkpoint=.../ckpt-2000]
    # Or at the end of training: --config.export.at_end=True

    # Serving side: TensorFlow only, no looper, any batch size.
    import tensorflow as tf
    serve = tf.saved_model.load("/tmp/imdb/export/2000").signatures[
        "serving_default"]
    serve(inputs=tf.constant(token_ids))["logits"]

Training feeds static shapes (every batch `train.batch_size`, XLA's rule);
serving takes any batch. The export traces a serving function
(`Trainer.serve`) once on an input signature made from one EXAMPLE's spec
(the first eval set's) with a leading None, so the train batch size appears
nowhere in the graph. The weights are the moving average when
`optimizer.ema_decay` is set (as eval sees them).

Layout: `workdir/export/<step>/` (`Workdir.export_version`), the versioned
layout TF Serving watches. The SavedModel is written to a hidden folder
beside it (`Workdir.export_partial`) and renamed into place, so a reader
never sees half an export. An object store renames a folder object by
object (a copy, then a delete): there the files move one by one with
`saved_model.pb`, which a loader opens first, last, so a reader that
finds it finds the rest; a folder without it may be in mid-move. On a
TPU a local workdir is written through the host
(`experimental_io_device='/job:localhost'`). The `export` block is
declared here (`config()`).
"""

import contextlib
import logging as std_logging
import os
from typing import Callable

from absl import logging
import keras
import ml_collections
import tensorflow as tf

from looper import fields
from looper import workdir as workdir_lib
from looper.workdir import checkpoint
from looper.workdir import files

SIGNATURE = "serving_default"


def input_signature(element_spec):
  """The serving inputs: one example's specs with a None batch dimension.

  Args:
    element_spec: the spec of one example's inputs (a TensorSpec, or a dict
      of them: each becomes a named input of the signature).
  """
  def batched(name, spec):
    return tf.TensorSpec([None, *spec.shape], spec.dtype, name=name)
  if isinstance(element_spec, dict):
    return {k: batched(k, s) for k, s in element_spec.items()}
  return batched("inputs", element_spec)


def export(model: keras.Model, serve: Callable, workdir: workdir_lib.Workdir,
           *, step: int, spec, weights: Callable = contextlib.nullcontext,
           on_tpu: bool = False) -> str:
  """Writes `model` for serving; returns the SavedModel folder.

  Args:
    model: the Keras model whose variables the export holds.
    serve: the signature's function, `serve(inputs) -> dict of tensors`
      (`Trainer.serve`: override it to add pre- or post-processing).
    workdir: the run's `looper.workdir.Workdir`; the export goes to its
      `export_version(step)`.
    step: the step the weights are of.
    spec: one example's inputs' spec (`input_signature`'s argument: the
      first eval set's, `Evaluator.example_spec`).
    weights: a context in which `model` holds the weights to export
      (`Evaluator.averaged_weights`: the weight average, as eval sees it).
    on_tpu: the variables live on a TPU (read through the host if local).
  """
  final = workdir.export_version(step)
  partial = workdir.export_partial(step)
  signature = input_signature(spec)
  archive = keras.export.ExportArchive()
  archive.track(model)
  # A dict of inputs becomes named inputs of the signature (the specs'
  # names), so a client sends {"tokens": ..., "mask": ...}.
  archive.add_endpoint(SIGNATURE, serve, input_signature=[signature])
  options = tf.saved_model.SaveOptions(
      experimental_io_device=checkpoint.io_device(on_tpu, workdir.root))
  for path in (partial, final):
    if tf.io.gfile.exists(path):  # an interrupted export, or a re-export
      tf.io.gfile.rmtree(path)
  # Saving sets absl's logger to WARNING and leaves it there (TensorFlow
  # 2.21): every INFO line after an export would vanish.
  absl_logger = std_logging.getLogger("absl")
  level = absl_logger.level
  try:
    with files.on_full_disk(workdir.export, f"the export of step {step}",
                            workdir.checkpoints):
      with weights():
        archive.write_out(partial, options=options, verbose=False)
      _move(partial, final)
  except Exception:  # a half-written export is never left behind
    if tf.io.gfile.exists(partial):
      tf.io.gfile.rmtree(partial)
    raise
  finally:
    absl_logger.setLevel(level)
  logging.info("Exported step %d for serving to %s", step, final)
  return final


def _move(partial: str, final: str) -> None:
  """Renames the folder `partial` to `final` (see module doc)."""
  if workdir_lib.posix(final):
    tf.io.gfile.rename(partial, final)
    return
  moved = [os.path.join(folder, name)
           for folder, _, names in tf.io.gfile.walk(partial) for name in names]
  moved.sort(key=lambda path: os.path.basename(path) == "saved_model.pb")
  for path in moved:
    target = final + path[len(partial):]
    files.makedirs(os.path.dirname(target))
    tf.io.gfile.rename(path, target)
  tf.io.gfile.rmtree(partial)


def config() -> ml_collections.ConfigDict:
  """The `export` block: each field's default."""
  c = ml_collections.ConfigDict()
  c.at_end = fields.boolean(False)
  return c
