"""MLflow as the run's tracker, against a real `mlflow server` on 127.0.0.1
(tests/fixtures/servers.py), read back with MlflowClient: a run and its
rerun are one MLflow run holding exactly metrics.jsonl's lines (and, with
no MLflow variable, the store is the workdir's); a kill -9
in the middle of a send, resumed, leaves no step twice and none lost; a
server that does not answer is one line before training, asked once; a
server that dies mid-run does not stop training (last: it ends the
module's server)."""

import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

import looper
from looper import errors
from looper import run
from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import jsonl
from tests.fixtures import needs
from tests.fixtures import tiny
from tests.fixtures.configs import configured, run_here
from tests.fixtures.processes import popen_looper
from tests.fixtures.servers import mlflow_server

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


def in_jsonl(wd) -> dict[str, list[tuple[int, float]]]:
  """metrics.jsonl's lines as a tracker names them: {name: [(step, value)]}."""
  out = {}
  for line in jsonl.read(wd.metrics):
    if line["kind"] in jsonl.PREFIXES:
      for name, value in jsonl.named(line).items():
        out.setdefault(name, []).append((line["step"], value))
  return out


def in_mlflow(client, run_id, names) -> dict[str, list[tuple[int, float]]]:
  """What the run holds of each of `names`, by step (a step twice: twice)."""
  return {name: sorted((m.step, m.value)
                       for m in client.get_metric_history(run_id, name))
          for name in names}


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
  line = str(e.value)
  assert line.startswith(f"config.trackers='mlflow': the MLflow server at"
                         f" {url} (MLFLOW_TRACKING_URI) does not answer (")
  assert line.endswith("); start it, or set MLFLOW_TRACKING_URI to one that"
                       " runs") and "\n" not in line
  assert asked == [1]
  assert not (tmp_path / "run").exists()


KILLED = ("--config=tests/fixtures/tiny.py", "--config.trackers=mlflow",
          "--config.train.steps=3000", "--config.checkpoint.every_steps=100",
          "--config.eval.every_steps=500", "--config.train.steps_per_loop=50")


@pytest.mark.slow  # a looper process, killed
def test_a_kill9_mid_send_and_the_rerun_leave_each_step_once(
    tracked, tmp_path):
  wd = workdir_lib.Workdir(str(tmp_path / "run"))
  proc = popen_looper(*KILLED, f"--workdir={wd.root}",
                      log=tmp_path / "killed.log")
  state = None
  try:
    # Some steps delivered; then the server freezes and the next send
    # hangs, its steps written down as being sent: killed there.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
      state = files.read_json(wd.tracker("mlflow"))
      if state and state["delivered"] >= 500:
        break
      time.sleep(0.05)
    else:
      pytest.fail(f"nothing delivered: {proc.log.read_text()[-3000:]}")
    tracked.signal(signal.SIGSTOP)
    try:
      while time.monotonic() < deadline and proc.poll() is None:
        state = files.read_json(wd.tracker("mlflow"))
        if state and state["sending"]:
          break
        time.sleep(0.05)
      proc.kill()
      proc.wait(timeout=60)
    finally:
      tracked.signal(signal.SIGCONT)  # what it had received is stored now
  finally:
    proc.kill()
  assert state["sending"], proc.log.read_text()[-3000:]

  run_here(*KILLED, f"--workdir={wd.root}")
  client = mlflow.MlflowClient(tracked.url)
  found = the_run(client, wd)
  expected = in_jsonl(wd)
  assert len(expected["train/loss"]) == 3000 // 50
  assert in_mlflow(client, found.info.run_id, expected) == expected


def test_a_server_dying_mid_run_does_not_stop_training(
    tracked, tmp_path, caplog, monkeypatch):
  """Last in this module: it ends the server."""
  wd = workdir_lib.Workdir(str(tmp_path))

  def end_server(now):
    if now.step == 20:
      tracked.signal(signal.SIGKILL)

  config = configured(tiny.get_config(), trackers="mlflow",
                      checkpoint__every_steps=10,
                      actions=[looper.Action(end_server, every_steps=10)])
  with caplog.at_level("INFO"):
    result = run.run(config, wd.root)
  assert result["step"] == 40
  said = [r.getMessage() for r in caplog.records]
  [warned] = [m for m in said if m.startswith("mlflow: could not deliver")]
  assert warned.endswith("training goes on, its writes are kept and sent"
                         " again after the next checkpoint")
  [closing] = [m for m in said if "  mlflow      run " in m]
  assert "writes of steps 20-40 NOT delivered (" in closing
  # The server's store, read directly: what came before it died...
  client = mlflow.MlflowClient(tracked.store)
  run_id = files.read_json(wd.tracker("mlflow"))["run_id"]
  assert in_mlflow(client, run_id, ["train/loss"]) == {
      "train/loss": in_jsonl(wd)["train/loss"][:1]}
  # ...and a rerun (nothing to train) with the store back sends the rest.
  monkeypatch.setenv("MLFLOW_TRACKING_URI", tracked.store)
  assert run.run(config, wd.root, verbose=False)["step"] == 40
  expected = in_jsonl(wd)
  assert in_mlflow(client, run_id, expected) == expected
