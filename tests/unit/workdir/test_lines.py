"""The lines a run prints: figures in fixed columns, the train rows within
120 columns, a detail line at --verbosity=1, advice once, the eval lines
one per set (a whole run's lines: tests/e2e/commands/test_console.py)."""

import logging
import re

import numpy as np
import pytest

from looper.workdir import formats
from looper.workdir import lines

TIME = " " * lines.TIME  # what absl's short format puts before a line


def said(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records]


def column_ends(line: str) -> list[int]:
  """Where each word of `line` ends: right-aligned columns end alike."""
  return [m.end() for m in re.finditer(r"\S+", line)]


@pytest.mark.parametrize("value, shown", [
    (0.262, "0.2620"), (0.008616, "0.008616"), (2.302585, "2.303"),
    (12.3, "12.30"), (1234.4, "1234"), (9.755e-4, "9.755e-4"),
    (1.234e-5, "1.234e-5"), (12345.6, "1.235e4"), (2000.0, "2000"),
    (0.0, "0"), (1.0, "1.000"), (0.99999, "1.000"), (10.0, "10"),
    (-0.5, "-0.5000"),
    (float("nan"), "nan")])
def test_a_figure_keeps_four_significant_digits(value, shown):
  assert formats.figure(value) == shown


def test_every_figure_fits_its_columns_and_reads_back():
  rng = np.random.default_rng(0)
  # 1e-9 up to 1e10: a one-digit exponent (a two-digit one takes 9).
  values = np.exp(rng.uniform(np.log(1e-9), np.log(9.99e9), 10000))
  for value in values:
    for text in (formats.figure(value), formats.exponent(value)):
      assert len(text) <= formats.WIDTH, (value, text)
      assert float(text) == pytest.approx(value, rel=5e-4), (value, text)


def test_learning_rates_and_rates_read_alike():
  assert [formats.exponent(v) for v in (9.755e-4, 1e-3, 0.1, 0.0)] == [
      "9.755e-4", "1.000e-3", "1.000e-1", "0"]
  assert [formats.rate(v) for v in (50.7, 4012.0, 101.0, 1.2, 123456.0)] == [
      "50.7", "4.01k", "101", "1.20", "123k"]


def loop(steps=(), metrics=()) -> dict[str, float]:
  """A loop's logs as the Controller hands them: the means of the step's
  per-step values (`steps`: (name, value)), the metrics (the first is
  accuracy), the health figures, the learning rate, the speed."""
  return {"loss": 0.8173, **dict(steps), "accuracy": 0.7492, **dict(metrics),
          "weight_norm": 14.43, "update_ratio": 0.7558,
          "input_wait_fraction": 0.01, "learning_rate": 9.755e-4,
          "steps_per_sec": 45.4, "examples_per_sec": 2906.0,
          "flops_per_sec": 1.05e11, "mfu": 0.566}


def test_train_rows_line_up_under_one_header_row(caplog):
  out = lines.Progress(total_steps=1000)
  with caplog.at_level(logging.INFO):
    out.write_scalars(100, loop())
    out.write_scalars(200, {**loop(), "loss": 0.262, "accuracy": 0.9219})
    out.write_scalars(1000, {**loop(), "loss": 0.008571,
                             "learning_rate": 0.0, "steps_per_sec": 64.9})
  legend, heading, *rows = said(caplog)
  assert legend == lines.LEGEND
  assert heading == (" " * 20 + "      loss  accuracy        lr   steps/s"
                     "       ETA")
  assert rows == [
      "train step  100/1000    0.8173    0.7492  9.755e-4      45.4   0:00:20",
      "train step  200/1000    0.2620    0.9219  9.755e-4      45.4   0:00:18",
      "train step 1000/1000  0.008571    0.7492         0      64.9   0:00:00"]


def test_a_row_shows_two_per_step_values_and_fits_120_columns(caplog):
  out = lines.Progress(total_steps=100000)
  out.per_step = ["loss", "d_loss", "g_loss", "d_accuracy"]
  logs = loop(steps=[("d_loss", 0.6931), ("g_loss", 0.6931),
                     ("d_accuracy", 0.5)],
              metrics=[("top5_accuracy", 0.99), ("precision_at_recall", 0.5),
                       ("recall", 0.5)])
  with caplog.at_level(logging.INFO):
    out.write_scalars(100, logs)
  _, heading, row = said(caplog)
  # The loss, the first metric, two per-step values, then more metrics
  # while they fit; the rest only in TensorBoard, metrics.jsonl, --verbosity.
  assert heading.split() == ["loss", "d_loss", "g_loss", "accuracy",
                             "top5_accuracy", "lr", "steps/s", "ETA"]
  assert "d_accuracy" not in heading.split()  # a third per-step value
  assert len(TIME + row) <= 120 < len(TIME + row) + 2 + len(
      "precision_at_recall")
  assert column_ends(row)[3:] == column_ends(heading)


def test_the_header_row_comes_back_after_an_evaluation(caplog):
  out = lines.Progress(total_steps=40)
  with caplog.at_level(logging.INFO):
    for step in (10, 20):
      out.write_scalars(step, loop())
    out.interrupted()
    out.write_scalars(30, loop())
    out.write_scalars(40, loop(steps=[("d_loss", 0.5)]))  # other columns
  shown = said(caplog)
  assert shown[0] == lines.LEGEND  # once
  assert [l.split()[2] if l.startswith("train") else l.split()[0]
          for l in shown[1:]] == ["loss", "10/40", "20/40", "loss", "30/40",
                                  "loss", "40/40"]


def test_verbosity_1_adds_a_detail_line_of_the_rest(caplog):
  out = lines.Progress(total_steps=1000)
  with caplog.at_level(logging.INFO):
    out.write_scalars(100, loop())
  assert not [l for l in said(caplog) if "detail" in l]
  caplog.clear()
  with caplog.at_level(logging.DEBUG, logger="absl"):  # --verbosity=1
    out.write_scalars(200, loop())
  row, detail = said(caplog)
  assert detail == (" " * 14 + "detail  2.91k examples/s, 105 GFLOP/s ="
                    " 56.6% MFU, input wait 1%  weight_norm    14.43\n" +
                    TIME + " " * 22 + "update_ratio   0.7558")
  assert max(len(l) for l in (TIME + detail).splitlines()) <= 120


def test_the_input_bound_advice_prints_once(caplog):
  out = lines.Progress(total_steps=100, input_hint="array mode: try X")
  with caplog.at_level(logging.INFO):
    for step, wait in ((10, 0.05), (20, 0.42), (30, 0.5), (40, 0.05),
                       (50, 0.6)):
      out.write_scalars(step, {"loss": 1.0, "steps_per_sec": 10.0,
                               "input_wait_fraction": wait})
  advice = [" ".join(l.split()) for l in said(caplog)  # unwrapped
            if l.startswith("input-bound")]
  assert advice == [
      "input-bound: the loop to step 20 waited for data 42% of its time"
      " (each loop's: metrics.jsonl's input_wait_fraction); array mode: try"
      " X"]


def test_eval_lines_one_per_set_the_loss_first_the_examples_last(caplog):
  logs = {"val/loss": 0.09066, "val/examples": 1000.0, "val/accuracy": 0.9715,
          "test/loss": 0.1, "test/examples": 1000.0, "test/accuracy": 0.97}
  with caplog.at_level(logging.INFO):
    lines.Logged("eval").write_scalars(500, logs)
    # An output's metrics ('digit/...') count no examples: one set.
    lines.Logged("eval").write_scalars(500, {
        "loss": 0.5, "examples": 64.0, "digit/accuracy": 0.5})
  assert said(caplog) == [
      "eval at step 500: val   loss  0.09066  accuracy   0.9715  examples"
      "     1000",
      "eval at step 500: test  loss   0.1000  accuracy   0.9700  examples"
      "     1000",
      "eval at step 500: loss   0.5000  digit/accuracy   0.5000  examples"
      "       64"]


def test_an_eval_line_wraps_at_120_columns_under_its_first_figure():
  logs = {f"metric_{i}": 0.5 for i in range(12)}
  [shown] = lines.evaluation(logs, "eval at step 5: ")
  rows = (TIME + shown).splitlines()
  assert len(rows) > 1 and max(len(r) for r in rows) <= 120
  assert {r.index("metric_") for r in rows} == {len(TIME + "eval at step 5: ")}
  assert " ".join(shown.split()[4:]) == " ".join(
      f"metric_{i} 0.5000" for i in range(12))
