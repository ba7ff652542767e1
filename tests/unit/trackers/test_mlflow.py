"""MLflow as the run's tracker, against a real `mlflow server` on 127.0.0.1
(tests/fixtures/servers.py), read back with MlflowClient: a run and its
rerun are one MLflow run holding exactly metrics.jsonl's lines (and, with
no MLflow variable, the store is the workdir's); a kill -9 (at a named
call: tests/fixtures/killer.py) before the run's id is kept or in the
middle of a send, then a rerun, leave one run, no step twice and none
lost; a server that does not answer is one line before training, asked
once; a server that goes away mid-run and comes back is one line each,
and nothing but looper's lines is on the screen; runs of one group (a
sweep's trials) nest under one parent run. The kills of the workdir's store: test_mlflow_kills.py."""

import json
import os
import re
import signal
import socket
import threading
import time

import numpy as np
import pytest

import looper
from looper import errors
from looper import run
from looper import trackers
from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import jsonl
from tests.fixtures import catalogue
from tests.fixtures import killer
from tests.fixtures import mlflow_runs
from tests.fixtures import needs
from tests.fixtures import tiny
from tests.fixtures.configs import configured, run_here
from tests.fixtures.mlflow_runs import in_jsonl, in_mlflow
from tests.fixtures.servers import Gate, mlflow_server

mlflow = needs.extra("mlflow", "mlflow")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  with mlflow_server(tmp_path_factory.mktemp("mlflow")) as s:
    yield s


@pytest.fixture
def tracked(server, monkeypatch, request):
  """The server as the tracker, an experiment of the test's own."""
  monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
  monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", request.node.name)
  return server


def exact_run(server, wd):
  """The one run of the test's experiment, exact (mlflow_runs.exact_run)."""
  client = mlflow.MlflowClient(server.url)
  return mlflow_runs.exact_run(client, wd, [client.get_experiment_by_name(
      os.environ["MLFLOW_EXPERIMENT_NAME"]).experiment_id])


def the_run(client, wd):
  """The one MLflow run of the test's experiment: the workdir's."""
  [found] = client.search_runs(
      [client.get_experiment_by_name(
          os.environ["MLFLOW_EXPERIMENT_NAME"]).experiment_id])
  assert found.info.run_id == files.read_json(wd.tracker("mlflow"))["run_id"]
  return found


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_a_run_and_its_rerun_are_one_run_holding_metrics_jsonl(
    tracked, tmp_path, caplog):
  wd = workdir_lib.Workdir(str(tmp_path))

  def log_samples(now):  # an action's writes reach the run too
    now.writer.write_scalars(now.step, {"user/step_sq": now.step ** 2})
    now.writer.write_images(now.step, {"samples": np.full(
        (2, 4, 4, 3), now.step, np.uint8)})

  config = configured(tiny.get_config(), trackers="mlflow", train__steps=30,
                      checkpoint__every_steps=10, eval__every_steps=10,
                      actions=[looper.Action(log_samples, every_steps=10)])
  run.run(config, wd.root, verbose=False)
  config.train.steps = 40  # a changed field: MLflow's params cannot change
  with caplog.at_level("INFO"):
    result = run.run(config, wd.root)
  client = mlflow.MlflowClient(tracked.url)
  found = the_run(client, wd)
  expected = in_jsonl(wd)
  assert {"train/loss", "eval/accuracy", "user/step_sq"} <= set(expected)
  assert in_mlflow(client, found.info.run_id, expected) == expected
  assert [s for s, _ in expected["train/loss"]] == [10, 20, 30, 40]
  assert (found.data.params["train.steps"],
          found.data.tags["changed/train.steps"],
          found.data.tags["looper.workdir"]) == ("30", "40", wd.root)
  assert found.info.status == "FINISHED"
  # The final figures of each attempt that finished (at 30, then 40).
  final = in_mlflow(client, found.info.run_id,
                    ["hparams/eval_accuracy", "goodput/goodput"])
  assert final["hparams/eval_accuracy"] == [
      (30, expected["eval/accuracy"][2][1]), (40, result["eval"]["accuracy"])]
  assert [s for s, _ in final["goodput/goodput"]] == [30, 40]
  assert all(0 < g < 1 for _, g in final["goodput/goodput"])
  images = [a.path for a in client.list_artifacts(found.info.run_id,
                                                  "images")]
  # Each image at its step (MLflow's names: 'samples/0' as samples~0).
  assert sorted({p.split("+timestamp")[0] for p in images
                 if p.endswith(".png")}) == sorted(
                     f"images/samples~{i}+step+{step}" for step in
                     (10, 20, 30, 40) for i in (0, 1))
  said = [r.getMessage() for r in caplog.records]
  assert any(m.startswith("mlflow: fields changed since run") and
             "train.steps=40 (param: 30)" in m for m in said)
  assert any(f"  mlflow      run {found.info.run_id} in {tracked.url}" in m
             and "writes sent" in m for m in said)

  # A send a kill interrupted (its steps written down, nothing after): the
  # rerun asks the server what it holds and sends none of it again.
  state = files.read_json(wd.tracker("mlflow"))
  files.write_text(wd.tracker("mlflow"), json.dumps(
      {**state, "delivered": 0, "sending": [1, 40]}))
  assert run.run(config, wd.root, verbose=False)["step"] == 40
  assert in_mlflow(client, found.info.run_id, expected) == expected


def test_a_group_s_runs_nest_under_one_parent_run(tracked, tmp_path):
  """config.trackers_group (looper sweep: the study's name): the first run
  makes the group's parent run, every other run and a rerun adopt it; a
  parent that a racing first run made too (it found none, then two) is
  deleted by its maker."""
  client = mlflow.MlflowClient(tracked.url)

  def trial(name: str, racing: bool = False) -> str:
    wd = workdir_lib.Workdir(str(tmp_path / name))
    [tracker] = trackers.build("mlflow", wd, group="study")
    if racing:  # its first search is before the other's parent was made
      searches = [lambda *a: []]
      real = client.search_runs
      tracker._client.search_runs = lambda *a: (  # pylint: disable=protected-access
          searches.pop()(*a) if searches else real(*a))
    tracker.open({"model.width": name})
    tracker.close(None, figures=None, status="FINISHED")
    return files.read_json(wd.tracker("mlflow"))["run_id"]

  ids = [trial("a"), trial("b"), trial("a"), trial("c", racing=True)]
  assert ids[2] == ids[0]  # a rerun: its run
  experiment = client.get_experiment_by_name(
      os.environ["MLFLOW_EXPERIMENT_NAME"]).experiment_id
  runs = client.search_runs([experiment])
  [parent] = [r for r in runs if "looper.group_parent" in r.data.tags]
  assert (parent.info.run_name, parent.data.tags["looper.group_parent"]) == (
      "study", "study")
  assert {r.info.run_id: (r.data.tags["mlflow.parentRunId"],
                          r.data.tags["looper.group"])
          for r in runs if r.info.run_id != parent.info.run_id} == {
              i: (parent.info.run_id, "study") for i in ids}
  every = client.search_runs([experiment],
                             run_view_type=mlflow.entities.ViewType.ALL)
  assert len(every) == len(runs) + 1  # the racing parent, deleted


@pytest.mark.slow  # over 2 s: out of the fast lane
def test_with_no_mlflow_variable_the_store_is_in_the_workdir(
    tmp_path, monkeypatch):
  """MLflow's own default would be ./mlflow.db and ./mlruns, in whatever
  folder the run was started from."""
  monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
  monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
  monkeypatch.chdir(tmp_path)
  wd = workdir_lib.Workdir(str(tmp_path / "run"))
  note = looper.Action(lambda now: now.writer.write_texts(
      now.step, {"note": f"step {now.step}"}), at_end=True)
  run.run(configured(tiny.get_config(), trackers="mlflow", actions=[note]),
          wd.root, verbose=False)
  client = mlflow.MlflowClient(f"sqlite:///{wd.mlflow_db}")
  experiment = client.get_experiment_by_name("looper")
  [found] = client.search_runs([experiment.experiment_id])
  expected = in_jsonl(wd)
  assert in_mlflow(client, found.info.run_id, expected) == expected
  [text] = (tmp_path / "run" / "mlruns").rglob("step-40.txt")
  assert text.read_text() == "step 40"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_server_that_does_not_answer_is_one_line_asked_once(
    tmp_path, monkeypatch):
  """MLflow's client would retry for minutes; looper asks once and stops
  before anything is written."""
  listener = socket.create_server(("127.0.0.1", 0))
  asked = []

  def hang_up():  # accepts, then closes at once: a server that fails
    while True:
      try:
        connection, _ = listener.accept()
      except OSError:  # closed: the test is over
        return
      asked.append(1)
      connection.close()

  threading.Thread(target=hang_up, daemon=True).start()
  url = f"http://127.0.0.1:{listener.getsockname()[1]}"
  monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
  try:
    with pytest.raises(errors.ConfigError) as e:
      run.Run(configured(tiny.get_config(), trackers="mlflow"),
              str(tmp_path / "run"), "train")
  finally:
    listener.close()
  assert re.fullmatch(catalogue.line("mlflow-server-does-not-answer",
                                     url=url), str(e.value)), str(e.value)
  assert asked == [1]
  assert not (tmp_path / "run").exists()


TINY = ("--config=tests/fixtures/tiny.py", "--config.trackers=mlflow")


@pytest.mark.slow  # a looper process, killed
def test_a_kill_before_the_run_id_is_kept_adopts_the_run(tracked, tmp_path):
  """Killed as `create_run` returns: the rerun finds the run by the token
  the workdir kept before making it."""
  wd = workdir_lib.Workdir(str(tmp_path / "run"))
  mlflow_runs.killed_then_rerun(
      "mlflow.tracking.client:MlflowClient.create_run", 1,
      [*TINY, f"--workdir={wd.root}"], tmp_path)
  found = exact_run(tracked, wd)
  assert found.data.params["train.steps"] == "40"  # sent by the rerun


@pytest.mark.slow  # a looper process, killed
def test_a_kill_mid_send_resends_only_what_the_server_lacks(tracked, tmp_path):
  """One send of 80 train lines (13 scalars each: two log_batch requests,
  1000 metrics each at most), then the action's images and texts of 8
  steps (tiny_media), 2 images a step: killed as the 3rd image goes (step
  20's first), the rerun asks what the run holds (the scalars, step 10's
  images), sends the rest (the images and texts from the workdir's spool)."""
  wd = workdir_lib.Workdir(str(tmp_path / "run"))
  args = ["--config=tests/fixtures/tiny_media.py", "--config.trackers=mlflow",
          "--config.train.steps=80", "--config.train.steps_per_loop=1",
          "--config.checkpoint.every_steps=80", "--config.eval.every_steps=80",
          f"--workdir={wd.root}"]
  proc = mlflow_runs.killed("mlflow.tracking.client:MlflowClient.log_image",
                            3, args, tmp_path, when="before")
  assert mlflow_runs.noise(proc.log.read_text()) == []
  # Killed mid-send indeed: the run holds that send's scalars and step
  # 10's two images, not the other 14.
  client = mlflow.MlflowClient(tracked.url)
  run_id = files.read_json(wd.tracker("mlflow"))["run_id"]
  assert len(in_mlflow(client, run_id, ["train/loss"])["train/loss"]) == 80
  assert sorted(a.path.split("+timestamp")[0]
                for a in client.list_artifacts(run_id, "images")
                if a.path.endswith(".png")) == [
                    "images/samples~0+step+10", "images/samples~1+step+10"]
  run_here(*args)
  found = exact_run(tracked, wd)  # the final figures (cut off) sent again
  assert len(in_jsonl(wd)["train/loss"]) == 80
  mlflow_runs.exact_media(mlflow.MlflowClient(tracked.url), wd,
                          found.info.run_id, range(10, 81, 10))


def wait_stopped(proc, timeout: float = 120) -> None:
  """Waits until `proc` stopped itself (killer.py's SIGSTOP)."""
  deadline = time.monotonic() + timeout
  while not killer.stopped(proc.pid):
    assert proc.poll() is None and time.monotonic() < deadline, (
        proc.log.read_text()[-3000:])
    time.sleep(0.02)


@pytest.mark.slow  # a looper process
def test_a_server_going_away_and_back_is_one_line_each(
    tracked, tmp_path, monkeypatch):
  """The run reaches the server through a Gate (tests/fixtures/servers.py)
  and stops itself before its 3rd delivery (at start, then after each
  save): the gate shuts, as when the server dies, and that send fails;
  before the 4th it opens. Its screen: looper's lines only (no urllib3
  retries, MLflow logs or "View run" prints)."""
  wd = workdir_lib.Workdir(str(tmp_path / "run"))
  args = (*TINY, "--config.train.steps=60",
          "--config.checkpoint.every_steps=10", f"--workdir={wd.root}")
  with Gate(tracked.port) as gate:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", gate.url)
    proc = mlflow_runs.start("looper.trackers.mlflow:MLflow.deliver", [3, 4],
                             args, tmp_path / "run.log", when="before",
                             sig="SIGSTOP")
    try:
      wait_stopped(proc)
      gate.shut()
      proc.send_signal(signal.SIGCONT)
      wait_stopped(proc)
      gate.open()
      proc.send_signal(signal.SIGCONT)
      assert proc.wait(timeout=120) == 0, proc.log.read_text()[-3000:]
    finally:
      proc.kill()
  exact_run(tracked, wd)  # read behind the gate
  said = proc.log.read_text().splitlines()
  assert mlflow_runs.noise("\n".join(said)) == []
  mine = [l[9:] for l in said if l[9:].startswith(("mlflow:", "WARNING: mlf"))]
  assert len(mine) == 2 and mine[1] == "mlflow: delivering again", mine
  assert re.fullmatch(catalogue.line("mlflow-could-not-deliver"), mine[0])
  [closing] = [l for l in said if l.startswith("  mlflow ")]
  assert closing.endswith(" writes sent")
