"""The bad-input catalogue (docs/catalogue.toml): each row's line, asserted.

A row with `fields` is reproduced here: tests/fixtures/tiny.py, trained to
step 20, run again with those overrides through `looper.run.run` fails with
the row's line (ConfigError / CheckpointError, whose str is what `python -m
looper.main` prints after 'looper: ') and leaves every file under
`checkpoints/` and `config.json` with its bytes and mtime. A row with
`flags` goes through the command line's parser (tests/unit/cli/
test_parsing.py's `parse`): its last line is 'looper: ' + the row's line.
Every other row is asserted by the one test that makes its fault, reading
the line through `catalogue.line(id)`; `test_every_row_is_asserted_once`
finds that call.
"""

import ast
import collections
import re
import shutil

from absl import logging as absl_logging
import pytest

from looper import config as lc
from looper import run
from looper.workdir import checkpoint
from tests.fixtures import catalogue
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.paths import ROOT
# The fixture: a config file's own error through the command line's parser.
from tests.unit.cli.test_parsing import parse  # pylint: disable=unused-import

ROWS = catalogue.rows()
BY_FIELDS = [i for i, row in ROWS.items() if "fields" in row]
BY_FLAGS = [i for i, row in ROWS.items() if "flags" in row]


# --- The run every case is thrown at ------------------------------------------


def config(fields=None):
  """tiny to step 30, saved every 10, evaluated at the end; `fields` set.

  The trained workdir is at step 20, so a run that wrongly went ahead would
  train and save.
  """
  c = configured(tiny.get_config(), train__steps=30, eval__every_steps=0,
                 checkpoint__every_steps=10)
  return configured(c, fields or {})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A workdir after 20 steps: ckpt-10, ckpt-20, config.json, events."""
  workdir = tmp_path_factory.mktemp("trained")
  c = config({"train.steps": 20})
  run.run(c, str(workdir), mode="train")
  return workdir


@pytest.fixture
def workdir(trained, tmp_path):
  """A private copy of the trained workdir (a case may damage it)."""
  copy = tmp_path / "run"
  shutil.copytree(trained, copy)
  return copy


def run_files(workdir) -> dict[str, tuple[bytes, int]]:
  """{path: (bytes, mtime)} of everything under checkpoints/ and config.json."""
  paths = [workdir / "config.json"] if (workdir / "config.json").exists() else []
  paths += [p for p in (workdir / "checkpoints").rglob("*") if p.is_file()]
  return {str(p.relative_to(workdir)): (p.read_bytes(), p.stat().st_mtime_ns)
          for p in paths}


def assert_fails(c, workdir, want, mode="train_and_eval", **kwargs):
  """run.run fails with the one line `want` (a regex from catalogue.line,
  matched whole), and leaves the checkpoints and config.json as they were."""
  before = run_files(workdir)
  assert before, "the case needs a workdir holding a run"
  with pytest.raises((lc.ConfigError, checkpoint.CheckpointError)) as e:
    run.run(c, str(workdir), mode=mode, **kwargs)
  message = str(e.value)
  assert "\n" not in message and "\x1b" not in message, repr(message)
  assert re.fullmatch(want, message), message
  after = run_files(workdir)
  changed = sorted(p for p in before.keys() | after.keys()
                   if before.get(p) != after.get(p))
  assert changed == [], f"a failed run changed {changed}"


def _known(row_id, **values):
  """The values whose {{name}} the row's line holds."""
  return {k: v for k, v in values.items()
          if "{{" + k + "}}" in ROWS[row_id]["line"]}


# --- The rows reproduced here -------------------------------------------------


@pytest.mark.parametrize("row_id", BY_FIELDS)
def test_a_config_override(workdir, row_id):
  row = ROWS[row_id]
  want = catalogue.line(row_id, **_known(row_id, workdir=workdir))
  assert_fails(config(ast.literal_eval(row["fields"])), workdir, want,
               mode=row.get("mode", "train_and_eval"))


@pytest.mark.parametrize("row_id", BY_FLAGS)
def test_a_command_line(tmp_path, parse, row_id):
  row = ROWS[row_id]
  config_file = tmp_path / "experiment.py"
  if "config_file" in row:
    config_file.write_text(row["config_file"])
  args = [a.replace("{{file}}", str(config_file)).replace(
      "{{dir}}", str(tmp_path)) for a in row["flags"]]
  try:
    last = parse(*args)[-1]
  finally:  # parsing set absl's --verbosity to its default, WARNING
    absl_logging.set_verbosity(absl_logging.INFO)
  assert last.startswith("looper: "), last
  assert re.fullmatch(catalogue.line(row_id, **_known(
      row_id, file=config_file, dir=tmp_path)), last[len("looper: "):]), last
  assert not (tmp_path / "run").exists()


# --- Every row asserted, by exactly one test ------------------------------------


def _claims() -> dict[str, set[str]]:
  """{row id: {'path::name' of each test calling catalogue.line or found
  with it}} over tests/ (a call outside a function: 'path::<module>')."""
  claims = collections.defaultdict(set)
  for path in sorted((ROOT / "tests").rglob("*.py")):
    where = str(path.relative_to(ROOT))
    for node in ast.parse(path.read_text()).body:
      owner = getattr(node, "name", "<module>")
      for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in catalogue.CLAIMING
            and getattr(call.func.value, "id", "") == "catalogue"
            and call.args and isinstance(call.args[0], ast.Constant)):
          claims[call.args[0].value].add(f"{where}::{owner}")
  return claims


def test_every_row_is_asserted_once():
  claims = _claims()
  assert not set(claims) - set(ROWS), "a test names a row the file lacks"
  reproduced = set(BY_FIELDS) | set(BY_FLAGS)
  twice = {i: sorted(claims[i]) for i in reproduced if claims.get(i)}
  assert not twice, "reproduced here and asserted elsewhere"
  orphans = [i for i in ROWS if i not in reproduced and not claims.get(i)]
  assert not orphans, ("rows no test asserts: make the fault in a test and"
                       " assert catalogue.line(id), or give the row fields")
  shared = {i: sorted(c) for i, c in claims.items() if len(c) > 1}
  assert not shared, "one test asserts each row"


def test_every_row_says_what_happened_and_the_fix():
  for row_id, row in ROWS.items():
    assert re.fullmatch(r"[a-z0-9-]+", row_id), row_id
    assert {"area", "did", "line", "fix"} <= row.keys(), row_id
    assert "\n" not in row["line"] and "…" not in row["line"], row_id
    assert not ("fields" in row and "flags" in row), row_id
