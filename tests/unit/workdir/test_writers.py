"""The writers, composed: each kind written once through a MultiWriter and
read back from the event files, metrics.jsonl and the log (a user action's
writes in a whole run: tests/unit/run/test_tensorboard.py)."""

import logging

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata

from looper import workdir as workdir_lib
from looper.workdir import jsonl
from looper.workdir import lines
from looper.workdir import writers
from tests.fixtures.events import scalars


class Recording(writers.Writer):
  """What a tracker would get: each call as (method, step, names)."""

  def __init__(self):
    self.calls = []

  def write_scalars(self, step, scalars):
    self.calls.append(("scalars", step, dict(scalars)))

  def write_images(self, step, images):
    self.calls.append(("images", step, sorted(images)))

  def write_histograms(self, step, arrays, num_buckets=None):
    self.calls.append(("histograms", step, sorted(arrays), num_buckets))

  def write_texts(self, step, texts):
    self.calls.append(("texts", step, dict(texts)))

  def write_hparams(self, hparams):
    self.calls.append(("hparams", dict(hparams)))


def test_each_kind_reaches_each_writer_that_holds_it(tmp_path, caplog):
  wd = workdir_lib.Workdir(str(tmp_path))
  events = writers.TensorBoard(wd.train_events, wd.checkpoints)
  log = jsonl.MetricsLog(wd.metrics)
  tracker = Recording()
  out = writers.MultiWriter([events, writers.MetricsLine(log, "action", wd),
                             lines.Logged("logged"),
                             writers.Prefixed(tracker, "user/")])
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, size=(3, 4, 5, 3), dtype=np.uint8)
  values = rng.normal(size=1000)
  with caplog.at_level(logging.INFO):
    out.write_scalars(500, {"retrieval@10": 0.8125, "count": 7.0})
  out.write_images(500, {"samples": images})
  out.write_histograms(500, {"logits": values}, {"logits": 7})
  out.write_texts(500, {"sample": "the cat sat"})
  out.write_hparams({"optimizer.name": "adam", "width": 16})
  out.close()

  assert scalars(wd.train_events, "retrieval@10") == {500: 0.8125}
  acc = event_accumulator.EventAccumulator(
      wd.train_events, size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  [image] = acc.Tensors("samples")
  width, height, *pngs = image.tensor_proto.string_val
  assert (image.step, int(width), int(height), len(pngs)) == (500, 5, 4, 3)
  for png, expected in zip(pngs, images):
    np.testing.assert_array_equal(tf.io.decode_png(png).numpy(), expected)
  [histogram] = acc.Tensors("logits")
  buckets = tf.make_ndarray(histogram.tensor_proto)  # (left, right, count)
  assert buckets.shape == (7, 3) and buckets[:, 2].sum() == 1000
  assert (buckets[0, 0], buckets[-1, 1]) == (values.min(), values.max())
  [text] = acc.Tensors("sample")
  assert text.tensor_proto.string_val == [b"the cat sat"]
  info = metadata.parse_session_start_info_plugin_data(
      acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
  assert (info.hparams["optimizer.name"].string_value,
          info.hparams["width"].number_value) == ("adam", 16)

  [line] = jsonl.read(wd.metrics)  # scalars only
  assert {k: line[k] for k in ("kind", "step", "retrieval@10", "count")} == {
      "kind": "action", "step": 500, "retrieval@10": 0.8125, "count": 7.0}
  assert [r.getMessage() for r in caplog.records
          if r.getMessage().startswith("logged")] == [
      "logged at step 500: retrieval@10   0.8125  count    7.000"]
  assert tracker.calls == [
      ("scalars", 500, {"user/retrieval@10": 0.8125, "user/count": 7.0}),
      ("images", 500, ["user/samples"]),
      ("histograms", 500, ["user/logits"], {"user/logits": 7}),
      ("texts", 500, {"user/sample": "the cat sat"}),
      ("hparams", {"optimizer.name": "adam", "width": 16})]


def test_a_line_s_names_outside_the_run_carry_its_kind():
  line = {"kind": "eval", "step": 10, "time": 1.5, "loss": 0.25,
          "examples": 100.0}
  assert jsonl.named(line) == {"eval/loss": 0.25, "eval/examples": 100.0}
  assert jsonl.named({**line, "kind": "train"}) == {
      "train/loss": 0.25, "train/examples": 100.0}
  assert jsonl.named({**line, "kind": "action"}) == {
      "loss": 0.25, "examples": 100.0}
