"""MLflow's workdir store exact at any kill: looper killed (SIGKILL,
tests/fixtures/killer.py) while MLflow makes the workdir's store, or inside
`set_terminated`, then the same command run again (here), leaves one run
holding each (metric, step) of metrics.jsonl once, read back with
MlflowClient; the killed process' screen holds looper's lines only. (The
other moments, against a server: test_mlflow.py; repeated trials at every
moment: `python -m tests.stress.mlflow_kills`.)
"""

import pytest

from looper import workdir as workdir_lib
from tests.fixtures import catalogue
from tests.fixtures import mlflow_runs
from tests.fixtures import needs

mlflow = needs.extra("mlflow", "mlflow")

TINY = ("--config=tests/fixtures/tiny.py", "--config.trackers=mlflow")


@pytest.fixture
def local(monkeypatch):
  """No MLflow variable: the workdir's store."""
  for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
               "MLFLOW_EXPERIMENT_ID"):
    monkeypatch.delenv(name, raising=False)


def store_after(at: str, wd, folder, *, nth=1, when="after"):
  """The workdir store's one run, exact (mlflow_runs.exact_run), after
  looper was killed at the `nth` call `at` and rerun."""
  mlflow_runs.killed_then_rerun(at, nth, [*TINY, f"--workdir={wd.root}"],
                                folder, when=when)
  return mlflow_runs.exact_run(
      mlflow.MlflowClient(f"sqlite:///{wd.mlflow_db}"), wd)


@pytest.mark.slow  # a looper process, killed
def test_a_kill_while_mlflow_makes_its_store_is_made_good(
    local, tmp_path, caplog):
  """Killed after its 9th table (experiment_tags: a migration's, whose
  stamp never came), every later open of the store failed with a 140-line
  traceback ("table experiment_tags already exists")."""
  wd = workdir_lib.Workdir(str(tmp_path / "run"))
  with caplog.at_level("INFO"):
    found = store_after("sqlalchemy:after_create", wd, tmp_path, nth=9)
  assert catalogue.found("mlflow-store-half-made", "\n".join(
      r.getMessage() for r in caplog.records), store=wd.mlflow_db)
  assert found.data.params["train.steps"] == "40"


@pytest.mark.slow  # a looper process, killed
def test_a_kill_inside_set_terminated_finishes_the_run_once(local, tmp_path):
  """Killed as set_terminated writes FINISHED, after the final figures
  were sent: the rerun (nothing to train) ends the run, sends none again
  (exact_run: the figures once)."""
  wd = workdir_lib.Workdir(str(tmp_path / "run"))
  found = store_after(
      "mlflow.store.tracking.sqlalchemy_store:SqlAlchemyStore.update_run_info",
      wd, tmp_path, when="before")
  assert found.data.params["train.steps"] == "40"
