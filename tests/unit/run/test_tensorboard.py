"""What TensorBoard and `looper runs` show of finished runs, read back.

One sweep of two tiny runs feeds every test: `a` traces a profiler window
on steps 11-15, stops at step 30 and is resumed to 40; `b` trains 20 steps
at another learning rate. The `tensorboard` fixture serves the sweep with
the real TensorBoard (a process on 127.0.0.1) and the tests read the JSON
its web UI renders.
"""

import collections
import contextlib
import json
import logging
import re
import sys
import time

from absl import logging as absl_logging
import numpy as np
import pytest
from tensorboard import plugin_util
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

import looper
from looper import console
from looper import errors
from looper import main
from looper import references
from looper import run
from looper import workdir as workdir_lib
from looper.cli import runs
from looper.train import trainer as trainer_lib
from looper.workdir import hparams
from looper.workdir import jsonl
from looper.workdir import summaries
from tests.fixtures import catalogue
from tests.fixtures import needs
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.events import scalars
from tests.fixtures.paths import ROOT
from tests.fixtures.servers import fetch, tensorboard_server


class RecordingTrainer(trainer_lib.Trainer):
  """Records where each loop ended, and the last instance (its model)."""
  loop_ends = []
  last = None

  def on_loop_end(self, step, logs):
    RecordingTrainer.loop_ends.append(step)
    RecordingTrainer.last = self


def tiny_config(**fields):
  return configured(tiny.get_config(), trainer=RecordingTrainer, **fields)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  """The sweep directory; loop ends per run of `a` (first, resumed)."""
  root = tmp_path_factory.mktemp("sweep")
  RecordingTrainer.loop_ends.clear()
  run.run(tiny_config(train__steps=30, profile__start_step=10), str(root / "a"))
  first, model = list(RecordingTrainer.loop_ends), RecordingTrainer.last.model
  RecordingTrainer.loop_ends.clear()
  run.run(tiny_config(train__steps=40, profile__start_step=10), str(root / "a"))
  resumed = list(RecordingTrainer.loop_ends)
  # b also runs the docs' action (its block as written) every 10 steps.
  [block] = re.findall(r"```python\n(import looper\n.*?)```",
                       (ROOT / "docs/pages/callbacks.md").read_text(), re.S)
  namespace = {}
  exec(block, namespace)  # pylint: disable=exec-used
  action = looper.Action(namespace["log_first_layer"], every_steps=10)
  run.run(tiny_config(train__steps=20, optimizer__learning_rate=0.02,
                      optimizer__warmup_steps=5, actions=[action]),
          str(root / "b"))
  return root, {"first": first, "resumed": resumed, "model": model,
                "b": RecordingTrainer.last.model}


def accumulator(logdir):
  acc = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  return acc


def texts(logdir, tag):
  return [e.tensor_proto.string_val[0].decode()
          for e in accumulator(logdir).Tensors(tag)]


def session_start(workdir):
  """(its events, the SessionStartInfo) of the HParams session in workdir."""
  acc = accumulator(workdir)
  tag = metadata.SESSION_START_INFO_TAG
  return acc.Tensors(tag), metadata.parse_session_start_info_plugin_data(
      acc.SummaryMetadata(tag).plugin_data.content)


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_hparams_are_the_set_fields_and_the_compared_ones_written_once(
    sweep):
  root, _ = sweep
  workdir = root / "a"
  # In its own run directory (none in the root), once: not again on resume.
  assert not list(workdir.glob("*tfevents*"))
  [event], info = session_start(workdir / "hparams")
  values = {k: getattr(v, v.WhichOneof("kind"))
            for k, v in info.hparams.items()}
  assert event.step == 0 and info.group_name == str(workdir)
  # The first start's config (train.steps=30, not the resume's 40).
  assert {k: v for k, v in values.items() if k != "settings"} == {
      "optimizer.learning_rate": 0.1, "train.batch_size": 32,
      "train.steps": 30}
  settings = dict(item.split("=", 1) for item in values["settings"].split())
  # First what runs always differ by, at their defaults too...
  assert list(settings)[:4] == ["optimizer.name", "optimizer.schedule",
                                "train.precision", "seed"]
  # ...then what tests/fixtures/tiny.py and this test set: not looper's
  # defaults.
  assert {k: settings[k] for k in ("optimizer.name", "profile.start_step",
                                   "model.width", "model_fn")} == {
      "optimizer.name": "sgd", "profile.start_step": "10",
      "model.width": "16", "model_fn": "tests.fixtures.tiny:model_fn"}
  for field in ("checkpoint.keep", "checkpoint.async_save",
                "eval.timeout_secs", "data.bucket"):
    assert field not in settings, field


def test_the_docs_action_writes_through_the_run_s_writers(sweep):
  """Images, a histogram and a scalar at steps 10 and 20, in train/ and
  (the scalar) metrics.jsonl; step 20's from b's final weights."""
  root, record = sweep
  kernel = record["b"].layers[0].kernel.numpy()
  acc = accumulator(root / "b" / "train")
  images = {e.step: e.tensor_proto.string_val
            for e in acc.Tensors("first_layer/image")}
  assert sorted(images) == [10, 20]
  [_, weights] = acc.Tensors("first_layer/weights")
  counts = tf.make_ndarray(weights.tensor_proto)[:, 2]
  assert weights.step == 20 and counts.sum() == kernel.size
  width, height, png = images[20]
  assert (int(width), int(height)) == (16, 8)  # units x inputs
  expected = (kernel - kernel.min()) / np.ptp(kernel)
  np.testing.assert_allclose(tf.io.decode_png(png).numpy()[..., 0] / 255,
                             expected, atol=1 / 255 + 1e-6)
  norms = scalars(root / "b" / "train", "first_layer/norm")
  assert sorted(norms) == [10, 20]
  assert norms[20] == pytest.approx(np.linalg.norm(kernel), rel=1e-6)
  actions = [l for l in jsonl.read(str(root / "b" / "metrics.jsonl"))
             if l["kind"] == "action"]
  assert [(l["step"], l["first_layer/norm"]) for l in actions] == [
      (10, pytest.approx(norms[10])), (20, pytest.approx(norms[20]))]


def test_model_summary_and_config_render_as_code_blocks(sweep):
  root, record = sweep
  [model] = texts(root / "a" / "train", "model_summary")  # once: not resumed
  [config] = texts(root / "a" / "train", "config")
  for text in (model, config):
    assert text.startswith("```\n") and text.endswith("\n```")
    assert plugin_util.markdown_to_safe_html(text).startswith("<pre><code>")
  expected = record["model"]
  for layer in expected.layers:
    assert f"{layer.name} ({type(layer).__name__})" in model
  assert f"Total params: {expected.count_params()} " in model
  assert json.loads(config[4:-4])["train"]["steps"] == 30


def test_the_profile_window_traces_its_steps_only(sweep):
  root, record = sweep
  # tiny: steps_per_loop=10, eval and checkpoint every 20; the window's
  # edges 10 and 15 end loops too.
  # Inside the window every loop is one step.
  assert record["first"] == [10, 11, 12, 13, 14, 15, 20, 30]
  assert record["resumed"] == [40]  # past the window: no new trace
  [trace] = (root / "a" / "train" / "plugins" / "profile").glob("*/*")
  assert trace.name.endswith(".xplane.pb")
  space = xplane_pb2.XSpace.FromString(trace.read_bytes())
  calls = collections.Counter(
      plane.event_metadata[e.metadata_id].name
      for plane in space.planes for line in plane.lines for e in line.events)
  # One call per step, each marked with its step (what the Profile tab's
  # step-time graph reads).
  assert calls["_train_loop"] == 5
  steps = sorted(
      stat.int64_value for plane in space.planes for line in plane.lines
      for e in line.events if plane.event_metadata[e.metadata_id].name ==
      "train" for stat in e.stats
      if plane.stat_metadata[stat.metadata_id].name == "step_num")
  assert steps == [11, 12, 13, 14, 15]
  assert not (root / "b" / "train" / "plugins").exists()  # off by default


def test_input_wait_and_learning_rate_beside_steps_per_sec(sweep):
  root, _ = sweep
  train = root / "a" / "train"
  loops = [10, 11, 12, 13, 14, 15, 20, 30, 40]
  for tag in ("input_wait_fraction", "learning_rate", "steps_per_sec"):
    assert sorted(scalars(train, tag)) == loops, tag
  assert all(r == pytest.approx(0.1)
             for r in scalars(train, "learning_rate").values())
  assert all(0 <= f <= 1 for f in scalars(train, "input_wait_fraction")
             .values())
  assert all(r > 0 for r in scalars(train, "steps_per_sec").values())
  # The same loop's figures as metrics.jsonl holds them (float32 here).
  lines = [l for l in jsonl.read(str(root / "a" / "metrics.jsonl"))
           if l["kind"] == "train"]
  assert [l["step"] for l in lines] == loops
  for tag in ("input_wait_fraction", "steps_per_sec", "examples_per_sec"):
    assert scalars(train, tag) == {
        l["step"]: pytest.approx(l[tag], rel=1e-6) for l in lines}, tag
  # A loop's speed is over its own time, within the time between its line
  # and the one before (the start line, or the previous loop's); every
  # step is one global batch of 32.
  before = jsonl.read(str(root / "a" / "metrics.jsonl"))[0]
  for line in lines:
    steps = line["step"] - before["step"]
    assert line["steps_per_sec"] * (line["time"] - before["time"]) >= (
        0.99 * steps), (line, before)
    assert line["examples_per_sec"] == pytest.approx(
        32 * line["steps_per_sec"])
    before = line


def rows(table: str) -> dict[str, dict[str, str]]:
  """{run: {column: cell}} of a `looper runs` table."""
  header, rule, *lines = table.strip().splitlines()
  assert set(rule) == {"|", "-"}
  split = lambda line: [c.strip() for c in line.strip("|").split("|")]
  columns = split(header)
  return {cells[0]: dict(zip(columns, cells))
          for cells in map(split, lines)}


def test_looper_runs_tabulates_the_last_and_best_eval(sweep, capsys,
                                                       monkeypatch):
  root, _ = sweep
  # Every column (the default fits 120 characters: test_sweep.py).
  monkeypatch.setattr(sys, "argv", ["looper", "runs", str(root),
                                    "--columns=all"])
  with pytest.raises(SystemExit) as exit_:
    main.cli()
  assert exit_.value.code == 0
  table = rows(capsys.readouterr().out)
  assert sorted(table) == [str(root / "a"), str(root / "b")]
  for name, step in [("a", 40), ("b", 20)]:
    row = table[str(root / name)]
    accuracy = scalars(root / name / "eval", "accuracy")
    best = max(accuracy, key=accuracy.get)
    assert row["step"] == str(step)
    assert row["accuracy"] == f"{accuracy[step]:.4g}"
    assert row["loss"] == f"{scalars(root / name / 'eval', 'loss')[step]:.4g}"
    assert row["best accuracy"] == f"{accuracy[best]:.4g} @{best}"
    assert list(row)[-1] == runs.WALL
  # The same rows for the workdirs named one by one.
  assert runs.main([str(root / "b"), str(root / "a"), "--columns=all"]) == 0
  assert rows(capsys.readouterr().out) == table


def test_looper_runs_names_what_holds_no_run(sweep, tmp_path, capsys):
  root, _ = sweep
  (tmp_path / "empty").mkdir()
  (tmp_path / "started" / "train").mkdir(parents=True)
  code = runs.main([str(tmp_path / "nope"), str(tmp_path / "empty"),
                    str(tmp_path / "started"), str(root / "b"),
                    "--columns=all"])
  out, err = capsys.readouterr()
  assert code == 1
  said = err.splitlines()
  assert len(said) == 3
  assert re.fullmatch(catalogue.line(
      "runs-missing-path", path=tmp_path / "nope"), said[0])
  assert re.fullmatch(catalogue.line(
      "runs-no-workdir", path=tmp_path / "empty"), said[1])
  assert re.fullmatch(catalogue.line(
      "runs-nothing-yet", path=tmp_path / "started"), said[2])
  assert list(rows(out)) == [str(root / "b")]


def test_counts_print_whole_in_the_lines_the_summary_and_the_table(
    tmp_path, caplog):
  wd = workdir_lib.Workdir(str(tmp_path))
  out = summaries.Summaries(wd, chief=True, total_steps=20, trains=True,
                            eval_dir=wd.eval_events)
  out.start_run("{}", "model")
  logs = {"loss": 0.312561, "examples": 10000.0, "accuracy": 0.90512,
          "true_positives": 12345.0}
  with caplog.at_level(logging.INFO):  # train: its progress line
    out.train(1, {"loss": [1.0, 0.5], "examples": [64000.0, 64000.0]},
              {"loss": 0.75, "examples": 64000.0, "steps_per_sec": 20.0})
    out.eval(2, logs)
  out.close()
  # The loss first, the count of examples last (after the other metrics).
  shown = ("loss   0.3126  accuracy   0.9051  true_positives    12345"
           "  examples    10000")
  # Only these: another test's background thread may log meanwhile.
  heading, progress, evaluated = [
      r.getMessage() for r in caplog.records if r.getMessage().startswith(
          ("train step", "eval", " "))]
  assert heading.split() == ["loss", "examples", "steps/s", "ETA"]
  assert progress.split()[:5] == ["train", "step", "2/20", "0.7500", "64000"]
  assert evaluated == f"eval at step 2: {shown}"
  closing = console.summary({"step": 2, "eval": logs}, wd, 3.0,
                            best=("examples", 2, 10000.0), checkpoint=None,
                            export=None).splitlines()
  assert closing[1:3] == [f"  last eval   {shown}",
                          "  best eval   examples 10000 at step 2"]
  row = runs.summarize(str(tmp_path))
  assert (row["loss"], row["true_positives"]) == ("0.3126", "12345")


def test_hparams_columns_are_columns_of_their_own_first():
  """config.hparams_columns (looper sweep: its swept fields): typed
  columns before the standard ones, out of `settings`; one line for a
  name that is no field holding a value."""
  config = configured(tiny.get_config(), hparams_columns="model.width,"
                      "optimizer.name,optimizer.learning_rate")
  table = hparams.Table.of(references.to_json(config), "{}", ["loss"])
  assert list(table.values) == [
      "model.width", "optimizer.name", "optimizer.learning_rate",
      "train.batch_size", "train.steps", "settings"]
  assert (table.values["model.width"], table.values["optimizer.name"]) == (
      16, "sgd")
  assert not re.search(r"\b(model\.width|optimizer\.name|hparams_columns)=",
                       table.values["settings"])
  hparams.check(config.hparams_columns, config)
  for value, name in (("model.widht", "model.widht"), ("model", "model"),
                      ("data.eval_splits", "data.eval_splits")):
    with pytest.raises(errors.ConfigError) as e:
      hparams.check(value, config)
    assert str(e.value) == (
        f"config.hparams_columns={value!r}: {name!r} is no field holding a"
        " number, string or boolean; name such fields (dotted, comma"
        " separated) in --config.hparams_columns")


def test_a_fresh_start_replaces_what_a_killed_attempt_wrote(tmp_path):
  """No checkpoint, so the run starts over: one record, the new one."""
  for steps in (10, 20):  # the first attempt dies before its first save
    config = json.dumps({"train": {"steps": steps}})
    wd = workdir_lib.Workdir(str(tmp_path))
    out = summaries.Summaries(
        wd, chief=True, total_steps=steps, trains=True,
        eval_dir=wd.eval_events,
        table=hparams.Table.of(config, "{}", ["loss"]))
    out.start_run(config, f"model {steps}")
    out.train(1, {"loss": [1.0, 0.5]}, {"loss": 0.75, "steps_per_sec": 2.0})
    out.close()
  assert texts(tmp_path / "train", "model_summary") == ["```\nmodel 20\n```"]
  [_], info = session_start(tmp_path / "hparams")
  assert info.hparams["train.steps"].number_value == 20
  assert scalars(tmp_path / "train", "loss") == {1: 1.0, 2: 0.5}
  assert [(l["kind"], l["step"])
          for l in jsonl.read(str(tmp_path / "metrics.jsonl"))] == [
      ("start", 0), ("train", 2)]


@contextlib.contextmanager
def absl_logging_level(level: int):
  was = absl_logging.get_verbosity()
  absl_logging.set_verbosity(level)
  try:
    yield
  finally:
    absl_logging.set_verbosity(was)


def test_the_writers_leave_no_number_of_a_loop_behind(tmp_path):
  """TensorFlow keeps each distinct Python int and float it makes an eager
  tensor of, with a reference to it, for the rest of the process (its
  scalar cache): written from Python numbers, every loop's steps and
  metrics stayed (issue 28's soak: +4.5 KB a loop). Nothing may hold them
  after the writes."""
  wd = workdir_lib.Workdir(str(tmp_path))
  out = summaries.Summaries(wd, chief=True, total_steps=10**12, trains=True,
                            eval_dir=wd.eval_events)
  # Fresh objects (no constant of this file's code holds them).
  first, at = int("1000000000001"), int("1000000000002")
  logs = {"loss": float("0.123456789"), "accuracy": float("0.987654321"),
          "steps_per_sec": float("123.456789")}
  numbers = [first, at, *logs.values()]
  before = [sys.getrefcount(n) for n in numbers]
  # WARNING: pytest keeps every INFO record it captures (and its args, the
  # numbers) for the test's report; the product keeps none.
  with absl_logging_level(absl_logging.WARNING):
    out.train(first, {"loss": [0.5, 0.25]}, logs)
    out.eval(at, logs)
    out.close()
  assert [sys.getrefcount(n) for n in numbers] == before
  assert scalars(tmp_path / "train", "accuracy") == {at: pytest.approx(
      0.987654321)}
  assert scalars(tmp_path / "eval", "steps_per_sec") == {at: pytest.approx(
      123.456789)}


def test_metrics_jsonl_has_a_line_per_loop_and_evaluation(sweep):
  root, _ = sweep
  lines = jsonl.read(str(root / "a" / "metrics.jsonl"))
  # Run a stopped at 30 and resumed to 40: each step once, in order.
  assert [(l["kind"], l["step"]) for l in lines] == [
      ("start", 0), ("train", 10), ("train", 11), ("train", 12),
      ("train", 13), ("train", 14), ("train", 15), ("train", 20),
      ("eval", 20), ("train", 30), ("eval", 30), ("train", 40),
      ("eval", 40)]
  times = [l["time"] for l in lines]
  assert times == sorted(times)
  train = root / "a" / "train"
  losses = scalars(train, "loss")
  for line in lines[1:]:
    if line["kind"] == "train":  # the loop's mean of the per-step losses
      first = max(s for s in [0, 10, 11, 12, 13, 14, 15, 20, 30]
                  if s < line["step"]) + 1
      assert line["loss"] == pytest.approx(
          sum(losses[s] for s in range(first, line["step"] + 1)) /
          (line["step"] + 1 - first), rel=1e-5)
      assert line["learning_rate"] == pytest.approx(
          scalars(train, "learning_rate")[line["step"]])
    else:
      for tag in ("accuracy", "loss", "examples"):
        assert line[tag] == pytest.approx(
            scalars(root / "a" / "eval", tag)[line["step"]])


@pytest.fixture(scope="module")
def board(sweep):
  """(URL of TensorBoard over the sweep, the sweep's root)."""
  root, _ = sweep
  with tensorboard_server(root) as url:
    wanted = {f"{r}/{d}" for r in "ab" for d in ("train", "eval", "hparams")}
    deadline = time.monotonic() + 60  # it loads the logdir in the background
    while set(fetch(url, "/data/runs")) != wanted:
      assert time.monotonic() < deadline, fetch(url, "/data/runs")
      time.sleep(0.5)
    yield url, root


@pytest.mark.slow  # a subprocess
def test_tensorboard_lists_train_eval_and_hparams_and_no_stray_run(board):
  url, _ = board
  assert sorted(fetch(url, "/data/runs")) == [
      "a/eval", "a/hparams", "a/train", "b/eval", "b/hparams", "b/train"]


@pytest.mark.slow  # a subprocess
def test_hparams_table_opens_on_rate_batch_and_eval_accuracy(board):
  url, root = board
  experiment = fetch(url, "/data/plugin/hparams/experiment",
                     {"experimentName": ""})
  # The web UI shows the first 5 hparams and the first 5 metrics before any
  # box is ticked (BUILD.md, "TensorBoard").
  # Four hparam columns: the web UI shows 5 (each 10em wide) before any
  # box is ticked, and a fifth would push the eval accuracy off a
  # 1400-pixel window (BUILD.md, "TensorBoard").
  assert [(h["name"], h["displayName"]) for h in
          experiment["hparamInfos"]] == [
              ("optimizer.learning_rate", "learning rate"),
              ("train.batch_size", "batch size"), ("train.steps", "steps"),
              ("settings", "")]
  assert [(m["name"]["tag"], m["displayName"])
          for m in experiment["metricInfos"]] == [
              ("hparams/eval_accuracy", "eval accuracy"),
              ("hparams/eval_loss", "eval loss"),
              ("hparams/best_eval_accuracy", "best eval accuracy"),
              ("hparams/train_loss", "train loss")]
  groups = fetch(url, "/data/plugin/hparams/session_groups", {
      "experimentName": "", "startIndex": 0, "sliceSize": 10,
      "allowedStatuses": ["STATUS_UNKNOWN"], "colParams": []})
  rows = {g["name"]: g for g in groups["sessionGroups"]}
  assert sorted(rows) == [str(root / "a"), str(root / "b")]
  for name, rate, step in [("a", 0.1, 40), ("b", 0.02, 20)]:
    row = rows[str(root / name)]
    assert row["hparams"]["optimizer.learning_rate"] == pytest.approx(rate)
    assert row["hparams"]["train.batch_size"] == 32
    # Set by b only: in b's settings, not in a's (the default there).
    assert ("optimizer.warmup_steps=5" in row["hparams"]["settings"]) == (
        name == "b")
    metrics = {m["name"]["tag"]: m["value"] for m in row["metricValues"]}
    accuracy = scalars(root / name / "eval", "accuracy")
    losses = scalars(root / name / "train", "loss")
    assert metrics["hparams/eval_accuracy"] == pytest.approx(accuracy[step])
    assert metrics["hparams/eval_loss"] == pytest.approx(
        scalars(root / name / "eval", "loss")[step])
    assert metrics["hparams/best_eval_accuracy"] == pytest.approx(
        max(accuracy.values()))
    # The last loop's mean loss: steps 31-40 of a, 11-20 of b.
    assert metrics["hparams/train_loss"] == pytest.approx(
        sum(losses[s] for s in range(step - 9, step + 1)) / 10, rel=1e-5)


@pytest.mark.slow  # a subprocess
def test_scalars_and_text_through_tensorboard(board):
  url, root = board
  served = fetch(url, "/data/plugin/scalars/scalars?run=a/train&tag=loss")
  assert {step: value for _, step, value in served} == pytest.approx(
      scalars(root / "a" / "train", "loss"))
  assert [step for _, step, _ in served] == list(range(1, 41))
  [config] = fetch(url, "/data/plugin/text/text?run=a/train&tag=config")
  assert config["text"].startswith("<pre><code>{")
  assert "&quot;learning_rate&quot;: 0.1" in config["text"]


@pytest.mark.slow  # a subprocess
def test_the_profile_tab_measures_each_traced_step(board):
  needs.extra("xprof.profile_plugin_loader", "profile")  # TensorBoard's tab
  url, _ = board
  [profile] = fetch(url, "/data/plugin/profile/runs")
  assert profile.startswith("a/train/")
  [host] = fetch(url, f"/data/plugin/profile/hosts?run={profile}"
                 "&tag=overview_page")
  overview = fetch(url, f"/data/plugin/profile/data?run={profile}"
                   f"&tag=overview_page&host={host['hostname']}")
  [steps] = [t for t in overview
             if t.get("cols") and t["cols"][0]["id"] == "stepnum"]
  assert [r["c"][0]["v"] for r in steps["rows"]] == [
      f"train {s}" for s in range(11, 16)]
  assert float(overview[1]["p"]["steptime_ms_average"]) > 0


def test_metrics_jsonl_is_cut_back_to_the_resumed_step(tmp_path):
  path = tmp_path / "metrics.jsonl"
  log = jsonl.MetricsLog(str(path))
  log.start()
  for step in (10, 20, 30):
    log.write("train", step, {"loss": 1.0 / step})
  log.write("eval", 30, {"loss": 0.5})
  with open(path, "a") as f:
    f.write('{"kind": "train", "st')  # a kill -9 in the middle of a line
  assert [l["step"] for l in jsonl.read(str(path))] == [0, 10, 20, 30, 30]
  log.truncate_after(20)
  lines = jsonl.read(str(path))
  assert [(l["kind"], l["step"]) for l in lines] == [
      ("start", 0), ("train", 10), ("train", 20)]
  assert lines[2]["loss"] == 1.0 / 20
  assert path.read_text().endswith("}\n")  # whole lines
  # A partial line alone is cut too: the next line must not glue to it.
  with open(path, "a") as f:
    f.write('{"kind": "eval", "st')
  log.truncate_after(20)
  log.write("train", 30, {"loss": 0.1})
  assert [l["step"] for l in jsonl.read(str(path))] == [0, 10, 20, 30]


@pytest.mark.slow  # a whole run (3 s)
def test_each_eval_set_is_named_set_slash_metric_everywhere(tmp_path, caplog,
                                                            capsys):
  """data.eval_splits: the eval line, TensorBoard, HParams, metrics.jsonl,
  `looper runs`, the best checkpoint and early stopping all say
  '<set>/<metric>', and '<set>/examples' counts the set."""
  caplog.set_level(logging.INFO, logger="absl")
  # Ranked the wrong way round (a loss, max): the second evaluation is no
  # better than the first, so patience 1 ends training there.
  c = tiny_config(train__steps=40, eval__every_steps=10, **{
      "data.eval_splits": {"val": "test[:50%]", "test": "test[50%:]"},
      "checkpoint.best_metric": "val/loss", "checkpoint.best_mode": "max",
      "train.early_stop_patience": 1})
  result = run.run(c, str(tmp_path))
  assert result["step"] == 20 and "val/loss has not improved" in (
      result["ended"])
  names = [f"{s}/{m}" for s in ("test", "val")
           for m in ("loss", "examples", "accuracy")]
  evals = [l for l in jsonl.read(str(tmp_path / "metrics.jsonl"))
           if l["kind"] == "eval"]
  assert [l["step"] for l in evals] == [10, 20]
  for line in evals:
    assert set(line) == {"kind", "step", "time", *names}
    assert (line["val/examples"], line["test/examples"]) == (500, 501)
  for name in names:  # the events, read back
    assert scalars(tmp_path / "eval", name) == {
        l["step"]: pytest.approx(l[name]) for l in evals}
  assert list(result["eval"]) == names  # the sets in name order
  # A line per set: its name, its loss first and its examples last, each
  # to 4 significant digits.
  lines = [r.getMessage().split(": ", 1)[1] for r in caplog.records
           if r.getMessage().startswith("eval at step 10: ")]
  assert [l.split()[0] for l in lines] == ["test", "val"]
  for line in lines:
    words = line.split()
    assert words[1::2] == ["loss", "accuracy", "examples"]
    assert [float(w) for w in words[2::2]] == pytest.approx(
        [evals[0][f"{words[0]}/{m}"] for m in words[1::2]], rel=5e-4)
  # HParams: a column per set and metric, each set's loss last, the best.
  acc = accumulator(tmp_path / "hparams")
  experiment = metadata.parse_experiment_plugin_data(
      acc.SummaryMetadata(metadata.EXPERIMENT_TAG).plugin_data.content)
  tags = [m.name.tag for m in experiment.metric_infos]
  assert tags == ["hparams/eval_test/accuracy", "hparams/eval_test/loss",
                  "hparams/eval_val/accuracy", "hparams/eval_val/loss",
                  "hparams/best_eval_val/loss", "hparams/train_loss"]
  for tag in tags[:4]:
    name = tag[len("hparams/eval_"):]
    assert scalars(tmp_path / "hparams", tag) == {
        l["step"]: pytest.approx(l[name]) for l in evals}
  assert scalars(tmp_path / "hparams", "hparams/best_eval_val/loss") == {
      10: pytest.approx(evals[0]["val/loss"]),
      20: pytest.approx(evals[0]["val/loss"])}
  history = json.loads((tmp_path / "checkpoints" / "best" /
                        "history.json").read_text())
  assert history["metric"] == "val/loss"
  assert runs.main([str(tmp_path), "--columns=all"]) == 0
  [row] = rows(capsys.readouterr().out).values()
  assert list(row)[2:7] == ["test/accuracy", "test/loss", "val/accuracy",
                            "val/loss", "best val/loss"]
  assert row["val/accuracy"] == f"{evals[1]['val/accuracy']:.4g}"
  assert row["best val/loss"] == f"{evals[0]['val/loss']:.4g} @10"
