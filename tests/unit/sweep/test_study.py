"""The study: seeded asks that survive a restart, a reused name, storages."""

import re
import socket
import threading
import time

import optuna
import pytest

from looper.errors import ConfigError
from looper.sweep import study as study_lib
from tests.fixtures import catalogue

SPEC = {"space": {"x": {"type": "float", "low": 0.0, "high": 1.0,
                        "log": False, "step": None},
                  "n": {"type": "int", "low": 1, "high": 9, "log": False,
                        "step": 2}},
        "objective": "eval/accuracy", "direction": "maximize"}


def _load(tmp_path, spec=SPEC, name="s"):
  storage = study_lib.open_storage(None, str(tmp_path))
  return study_lib.load(storage, name, spec, sampler="tpe", seed=3,
                        pruner="median", pruner_startup=5)


def _asks(study, count):
  values = []
  for _ in range(count):
    trial, params = study_lib.ask(study, SPEC["space"], sampler="tpe", seed=3)
    study.tell(trial, params["x"])
    values.append(params)
  return values


def test_a_seeded_sequence_survives_a_restart(tmp_path):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  whole = _asks(_load(tmp_path / "a"), 4)
  first = _asks(_load(tmp_path / "b"), 2)
  # A new process: the sampler made anew, the history from the storage.
  rest = _asks(_load(tmp_path / "b"), 2)
  assert first + rest == whole
  assert len({p["x"] for p in whole}) == 4


def test_a_reused_name_with_another_space_or_direction_is_refused(tmp_path):
  _load(tmp_path)
  for key, value in (("direction", "minimize"),
                     ("space", {"x": SPEC["space"]["x"]})):
    with pytest.raises(ConfigError) as e:
      _load(tmp_path, dict(SPEC, **{key: value}))
    assert re.fullmatch(catalogue.line("sweep-study-reused", name="s",
                                       what=key), f"looper sweep: {e.value}")
  assert _load(tmp_path).user_attrs["looper"] == SPEC


def test_a_grid_takes_every_value_and_needs_steps():
  assert study_lib.grid({"n": SPEC["space"]["n"]}) == {"n": [1, 3, 5, 7, 9]}
  with pytest.raises(ConfigError) as e:
    study_lib.grid(SPEC["space"])
  assert re.fullmatch(catalogue.line("sweep-grid-continuous", key="x"),
                      f"looper sweep: {e.value}")


def test_a_journal_file_is_a_storage(tmp_path):
  storage = study_lib.open_storage(str(tmp_path / "s.journal"),
                                   str(tmp_path))
  assert isinstance(storage, optuna.storages.JournalStorage)


def test_a_server_that_never_answers_is_one_line_in_seconds(
    tmp_path, monkeypatch):
  pytest.importorskip("psycopg")
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen()
  accepted = []
  threading.Thread(target=lambda: accepted.append(listener.accept()),
                   daemon=True).start()
  monkeypatch.setattr(study_lib, "CONNECT_SECS", 1)
  port = listener.getsockname()[1]
  url = f"postgresql://u:p@127.0.0.1:{port}/db"
  start = time.monotonic()
  with pytest.raises(ConfigError) as e:
    study_lib.open_storage(url, str(tmp_path))
  assert time.monotonic() - start < 5
  assert re.fullmatch(catalogue.line("sweep-storage-no-answer", url=url),
                      f"looper sweep: {e.value}"), str(e.value)
  assert accepted
  listener.close()
  accepted[0][0].close()


def test_a_left_running_trial_is_reported_to_and_told_anew(tmp_path):
  """study.trial_of: a Trial made from the storage's public lookups (what
  a worker taking a dead worker's trial over does). If Optuna changes its
  Trial's constructor or the lookups, this fails."""
  storage = study_lib.open_storage(None, str(tmp_path))
  s = study_lib.load(storage, "s", SPEC, sampler="random", seed=0,
                     pruner="none", pruner_startup=0)
  first, _ = study_lib.ask(s, SPEC["space"], sampler="random", seed=0)
  first.report(0.25, 10)  # then its worker died
  again = study_lib.trial_of(s, storage, first.number)
  assert isinstance(again, optuna.Trial) and again.params == first.params
  again.report(0.5, 20)
  assert not again.should_prune()
  s.tell(again, 0.5)
  done = study_lib.frozen(s, first.number)
  assert (done.state, done.value, done.intermediate_values) == (
      optuna.trial.TrialState.COMPLETE, 0.5, {10: 0.25, 20: 0.5})
