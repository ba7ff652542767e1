"""What TensorBoard and `looper runs` show of finished runs, read back.

One sweep of two tiny runs feeds every test: `a` traces a profiler window
on steps 11-15, stops at step 30 and is resumed to 40; `b` trains 20 steps
at another learning rate.
"""

import collections
import json
import sys

import pytest
from tensorboard import context
from tensorboard import plugin_util
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import backend_context
from tensorboard.plugins.hparams import list_session_groups
from tensorboard.plugins.hparams import metadata
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from looper import main
from looper import run
from looper import runs
from looper import summaries
from looper import trainer as trainer_lib
from tests import tiny
from tests.conftest import scalars


class RecordingTrainer(trainer_lib.Trainer):
  """Records where each loop ended, and the last instance (its model)."""
  loop_ends = []
  last = None

  def on_loop_end(self, step, logs):
    RecordingTrainer.loop_ends.append(step)
    RecordingTrainer.last = self


def tiny_config(**fields):
  c = tiny.get_config()
  c.trainer = RecordingTrainer
  for field, value in fields.items():
    section, name = field.split("__")
    c[section][name] = value
  return c


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
  run.run(tiny_config(train__steps=20, optimizer__learning_rate=0.02),
          str(root / "b"))
  return root, {"first": first, "resumed": resumed, "model": model}


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


def test_hparams_are_the_flat_config_written_once(sweep):
  root, _ = sweep
  workdir = root / "a"
  assert len(list(workdir.glob("*tfevents*"))) == 1  # not again on resume
  [event], info = session_start(workdir)
  hparams = {k: getattr(v, v.WhichOneof("kind"))
             for k, v in info.hparams.items()}
  assert event.step == 0 and info.group_name == str(workdir)
  # The first start's config: train.steps=30, not the resume's 40.
  assert {k: hparams[k] for k in ("train.batch_size", "train.steps",
                                  "optimizer.name", "profile.start_step",
                                  "model_fn", "model.width")} == {
      "train.batch_size": 32, "train.steps": 30, "optimizer.name": "sgd",
      "profile.start_step": 10, "model_fn": "tests.tiny:model_fn",
      "model.width": 16}
  # No HParams value: None (eval.steps) and tuples (metrics).
  assert "eval.steps" not in hparams and "metrics" not in hparams


def test_the_hparams_tab_compares_the_runs_by_their_last_eval(sweep):
  root, _ = sweep
  mux = plugin_event_multiplexer.EventMultiplexer()
  mux.AddRunsFromDirectory(str(root))
  mux.Reload()
  tb = base_plugin.TBContext(
      logdir=str(root), multiplexer=mux,
      data_provider=data_provider.MultiplexerDataProvider(mux, str(root)))
  request = api_pb2.ListSessionGroupsRequest(
      start_index=0, slice_size=10, allowed_statuses=[api_pb2.STATUS_UNKNOWN])
  response = list_session_groups.Handler(
      context.RequestContext(), backend_context.Context(tb), "",
      request).run()
  groups = {g.name: g for g in response.session_groups}
  assert sorted(groups) == [str(root / "a"), str(root / "b")]
  for name, rate, step in [("a", 0.1, 40), ("b", 0.02, 20)]:
    group = groups[str(root / name)]
    assert group.hparams["optimizer.learning_rate"].number_value == rate
    metrics = {(m.name.group, m.name.tag): m.value
               for m in group.metric_values}
    for tag in ("accuracy", "loss"):
      assert metrics["eval", tag] == pytest.approx(
          scalars(root / name / "eval", tag)[step])


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
  assert record["first"] == [10, 15, 20, 30]
  assert record["resumed"] == [40]  # past the window: no new trace
  [trace] = (root / "a" / "train" / "plugins" / "profile").glob("*/*")
  assert trace.name.endswith(".xplane.pb")
  space = xplane_pb2.XSpace.FromString(trace.read_bytes())
  calls = collections.Counter(
      plane.event_metadata[e.metadata_id].name
      for plane in space.planes for line in plane.lines for e in line.events)
  assert calls["_train_loop"] == 1  # steps 11-15: one loop
  assert not (root / "b" / "train" / "plugins").exists()  # off by default


def test_input_wait_and_learning_rate_beside_steps_per_sec(sweep):
  root, _ = sweep
  train = root / "a" / "train"
  loops = [10, 15, 20, 30, 40]
  for tag in ("input_wait_fraction", "learning_rate", "steps_per_sec"):
    assert sorted(scalars(train, tag)) == loops, tag
  assert all(r == pytest.approx(0.1)
             for r in scalars(train, "learning_rate").values())
  assert all(0 <= f <= 1 for f in scalars(train, "input_wait_fraction")
             .values())
  assert all(r > 0 for r in scalars(train, "steps_per_sec").values())


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
  monkeypatch.setattr(sys, "argv", ["looper", "runs", str(root)])
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
    assert list(row)[-1] == "wall time"
  # The same rows for the workdirs named one by one.
  assert runs.main([str(root / "b"), str(root / "a")]) == 0
  assert rows(capsys.readouterr().out) == table


def test_looper_runs_names_what_holds_no_run(sweep, tmp_path, capsys):
  root, _ = sweep
  (tmp_path / "empty").mkdir()
  (tmp_path / "started" / "train").mkdir(parents=True)
  code = runs.main([str(tmp_path / "nope"), str(tmp_path / "empty"),
                    str(tmp_path / "started"), str(root / "b")])
  out, err = capsys.readouterr()
  assert code == 1
  assert err.splitlines() == [
      f"looper runs: {tmp_path}/nope does not exist",
      f"looper runs: {tmp_path}/empty holds no looper workdir (train/ or"
      " eval/), here or one level down",
      f"looper runs: {tmp_path}/started has no train or eval scalars yet"]
  assert list(rows(out)) == [str(root / "b")]


def test_a_fresh_start_replaces_what_a_killed_attempt_wrote(tmp_path):
  """No checkpoint, so the run starts over: one record, the new one."""
  for steps in (10, 20):  # the first attempt dies before its first save
    out = summaries.Summaries(str(tmp_path), chief=True, total_steps=steps)
    out.start_run(json.dumps({"train": {"steps": steps}}), f"model {steps}")
    out.train(1, [1.0, 0.5], {"steps_per_sec": 2.0})
    out.close()
  assert texts(tmp_path / "train", "model_summary") == ["```\nmodel 20\n```"]
  [_], info = session_start(tmp_path)
  assert info.hparams["train.steps"].number_value == 20
  assert scalars(tmp_path / "train", "loss") == {1: 1.0, 2: 0.5}
