"""Export for serving: a SavedModel with a free batch dimension.

A run on 2 replicas with a weight average exports at its end; a fresh
process with TensorFlow only (looper never imported) loads it and predicts
at batch sizes 1, 7 and 64; the predictions match the averaged weights of
the checkpoint, restored here into the model independently of the export.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from looper import config as lc
from looper import run
from looper import workdir as workdir_lib
from looper.workdir import checkpoint
from tests.fixtures import checkpoints
from tests.fixtures import pieces
from tests.fixtures import processes
from tests.fixtures import tiny
from tests.fixtures.configs import run_here

STEPS = 20
ARGS = ("--config=tests/fixtures/tiny.py", f"--config.train.steps={STEPS}",
        "--config.checkpoint.every_steps=10", "--config.optimizer.ema_decay=0.9",
        "--config.distribution.num_cpu_devices=2", "--config.export.at_end=True",
        "--mode=train")

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("export")
  run_here(f"--workdir={workdir}", *ARGS)  # the session's 2 logical CPUs
  return workdir


def _restored_trainer(workdir, prefix):
  config = tiny.get_config()
  config.optimizer.ema_decay = 0.9
  return checkpoints.restored_trainer(config, prefix)


@pytest.mark.slow  # a subprocess
def test_export_serves_any_batch_from_tf_alone(trained, tmp_path):
  exports = trained / "export"
  # Renamed into place: no partial folder left beside the version.
  assert sorted(os.listdir(exports)) == [str(STEPS)]
  x, _ = tiny.make_data(64, seed=5)
  served = processes.serve_in_fresh_process(exports / str(STEPS), x, tmp_path)
  assert served["input"] == [[None, tiny.FEATURES], "float32"]
  assert not served["looper_imported"]

  trainer = _restored_trainer(trained, trained / "checkpoints" / f"ckpt-{STEPS}")
  trained_logits = trainer.model(x, training=False).numpy()
  with pieces.evaluator(trainer).averaged_weights():
    averaged_logits = trainer.model(x, training=False).numpy()
  for n in (1, 7, 64):
    np.testing.assert_allclose(served[str(n)], averaged_logits[:n],
                               rtol=1e-5, atol=1e-6)
  # The average really is what was exported, not the last weights.
  assert not np.allclose(averaged_logits, trained_logits, atol=1e-4)


@pytest.mark.slow  # a subprocess
def test_mode_export_of_an_older_checkpoint(trained, tmp_path):
  config = tiny.get_config()
  config.optimizer.ema_decay = 0.9
  older = str(trained / "checkpoints" / "ckpt-10")
  result = run.run(config, str(trained), "export", older)
  assert result["step"] == 10 and result["checkpoint"] == older
  assert result["export"] == str(trained / "export" / "10")
  assert sorted(os.listdir(trained / "export")) == ["10", str(STEPS)]
  x, _ = tiny.make_data(7, seed=6)
  served_10 = processes.serve_in_fresh_process(result["export"], x, tmp_path)
  trainer = _restored_trainer(trained, older)
  with pieces.evaluator(trainer).averaged_weights():
    np.testing.assert_allclose(served_10["7"], trainer.model(x).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_export_without_checkpoint_is_one_line(tmp_path):
  with pytest.raises(checkpoint.CheckpointError,
                     match="--mode=export found no checkpoint") as e:
    run.run(tiny.get_config(), str(tmp_path), "export")
  assert "\n" not in str(e.value)
  assert not (tmp_path / "export").exists()


def test_checkpoint_flag_is_for_eval_and_export(tmp_path):
  with pytest.raises(lc.ConfigError, match="--mode=eval and --mode=export"):
    run.run(tiny.get_config(), str(tmp_path), "train", "/x/ckpt-1")


def test_input_signature_has_free_batch_and_named_inputs():
  from looper.workdir import export
  spec = export.input_signature(tf.TensorSpec([28, 28, 1], tf.float32))
  assert spec.shape.as_list() == [None, 28, 28, 1] and spec.name == "inputs"
  specs = export.input_signature({"tokens": tf.TensorSpec([64], tf.int32),
                                  "mask": tf.TensorSpec([64], tf.bool)})
  assert {k: (s.shape.as_list(), s.name) for k, s in specs.items()} == {
      "tokens": ([None, 64], "tokens"), "mask": ([None, 64], "mask")}


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("workdir,device", [("LOCAL", "/job:localhost"),
                                            ("gs://bucket/run", None)])
def test_tpu_export_of_a_local_workdir_goes_through_the_host(
    trained, tmp_path, monkeypatch, workdir, device):
  import keras
  from looper.workdir import export
  seen = {}

  def write_out(self, path, options=None, verbose=True):
    seen["device"] = options.experimental_io_device

  # ExportArchive() returns the backend's subclass: patch what it returns.
  monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out",
                      write_out)
  monkeypatch.setattr(export, "_move", lambda partial, final: None)
  trainer = _restored_trainer(trained, trained / "checkpoints" / "ckpt-10")
  workdir = str(tmp_path) if workdir == "LOCAL" else workdir
  monkeypatch.setattr(tf.io.gfile, "exists", lambda path: False)
  evaluator = pieces.evaluator(trainer)
  export.export(trainer.model, trainer.serve, workdir_lib.Workdir(workdir),
                step=trainer.global_step, spec=evaluator.example_spec(),
                weights=evaluator.averaged_weights, on_tpu=True)
  assert seen["device"] == device


def test_export_in_process_serves_what_the_model_computes(tmp_path):
  from looper.workdir import export  # pylint: disable=g-import-not-at-top
  trainer = pieces.trainer(tiny.get_config(), tf.distribute.get_strategy())
  trainer.train(3)
  evaluator = pieces.evaluator(trainer)
  path = export.export(trainer.model, trainer.serve,
                       workdir_lib.Workdir(str(tmp_path)),
                       step=trainer.global_step,
                       spec=evaluator.example_spec(),
                       weights=evaluator.averaged_weights)
  assert path == str(tmp_path / "export" / "3")
  assert not list((tmp_path / "export").glob(".partial-*"))
  serve = tf.saved_model.load(path).signatures["serving_default"]
  x = tiny.make_data(5, seed=9)[0]
  expected = trainer.model(x, training=False).numpy()
  np.testing.assert_allclose(serve(inputs=tf.constant(x))["logits"].numpy(),
                             expected, rtol=1e-5, atol=1e-6)
  # README, "Serving": NumPy's float64 is converted to the float32
  # signature; a float64 tensor is refused, and serves once cast.
  wide = x.astype(np.float64)
  np.testing.assert_allclose(serve(inputs=wide)["logits"].numpy(), expected,
                             rtol=1e-5, atol=1e-6)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="expected to be a float tensor but is a double"):
    serve(inputs=tf.constant(wide))
  np.testing.assert_allclose(
      serve(inputs=tf.cast(tf.constant(wide), tf.float32))["logits"].numpy(),
      expected, rtol=1e-5, atol=1e-6)
