"""looper.cli.parsing: what a config file's own error and an override typo
end in (the traceback from the file's frame, or one line), through the
parser `python -m looper.main` calls, on its flags, in this process: the
stderr a run would show is what the parser printed, then its exit line.
The same through a real process: tests/e2e/commands/test_parsing.py.
"""

import sys

from absl import flags
import pytest

from looper import main  # pylint: disable=unused-import  (its flags)
from looper.cli import parsing


@pytest.fixture
def parse(monkeypatch, capsys):
  """parse(ARGS) -> the non-empty lines `looper ARGS` ends stderr with
  when the flags fail to parse (its exit status is 1)."""
  def run(*args):
    argv = ["looper", *args]
    # config_flags registers the --config.* overrides it finds in sys.argv.
    monkeypatch.setattr(sys, "argv", argv)
    # As in a new process: no flag parsed yet, and no module of an earlier
    # config file (config_flags loads each into the same module object,
    # by the name "config_config": its get_config() would stay).
    flags.FLAGS.unparse_flags()
    # Nor an override flag an earlier parse in this process registered
    # (config_flags adds one per --config.FIELD seen: a second is "defined
    # twice").
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
      delattr(flags.FLAGS, name)
    monkeypatch.delitem(sys.modules, "config_config", raising=False)
    with pytest.raises(SystemExit) as e:
      parsing.parse_flags(argv)
    assert isinstance(e.value.code, str)  # printed as the last line, exit 1
    printed = capsys.readouterr().err.splitlines()
    return [l for l in printed if l.strip()] + [e.value.code]
  return run


def test_attribute_error_at_config_module_level_is_not_an_override(
    tmp_path, parse):
  config = tmp_path / "typo_config.py"
  config.write_text("from looper import config as lc\n"
                    "DEFAULTS = lc.defualt_config()\n"
                    "def get_config():\n  return DEFAULTS\n")
  lines = parse(f"--config={config}", f"--workdir={tmp_path}/run")
  assert not [l for l in lines if "the config has no field" in l]
  assert f'  File "{config}", line 2, in <module>' in lines
  assert lines[-1].startswith(
      f"looper: --config={config}: loading the config file raised"
      " AttributeError(")


def test_config_file_that_does_not_compile_is_one_line(tmp_path, parse):
  """One line (was 56 lines of absl's and importlib's frames), in every
  mode: the file is loaded with the flags, before a mode runs."""
  config = tmp_path / "bad.py"
  config.write_text("from tests.fixtures import tiny\n\n"
                    "def get_config(:\n"
                    "  return tiny.get_config()\n")
  assert parse(f"--config={config}", "--mode=check") == [
      f"looper: --config={config}: invalid syntax at line 3"
      " (def get_config(:); fix the config file"]


def test_config_file_that_raises_at_import_shows_its_line(tmp_path, parse):
  config = tmp_path / "undefined.py"
  config.write_text("from tests.fixtures import tiny\n"
                    "SIZE = undefined_name\n\n"
                    "def get_config():\n"
                    "  return tiny.get_config()\n")
  lines = parse(f"--config={config}", f"--workdir={tmp_path}/run")
  # The traceback starts at the file's own frame: no absl or importlib.
  assert lines[:3] == ["Traceback (most recent call last):",
                       f'  File "{config}", line 2, in <module>',
                       "    SIZE = undefined_name"], lines
  assert lines[-2:] == [
      "NameError: name 'undefined_name' is not defined",
      f"looper: --config={config}: loading the config file raised"
      " NameError(\"name 'undefined_name' is not defined\"); see the"
      " traceback above"]
  assert len(lines) <= 6, lines


def test_looper_s_own_error_in_a_config_file_is_one_line_with_its_line(
    tmp_path, parse):
  """A ConfigError looper raises in the file's code (an Action without a
  trigger) is its line and where: no traceback."""
  config = tmp_path / "untriggered.py"
  config.write_text("import looper\n"
                    "from tests.fixtures import tiny\n\n"
                    "def get_config():\n"
                    "  c = tiny.get_config()\n"
                    "  c.actions = [looper.Action(print, every_steps=0)]\n"
                    "  return c\n")
  assert parse(f"--config={config}", f"--workdir={tmp_path}/run") == [
      f"looper: --config={config}, line 6: looper.Action(print) has no"
      " trigger, so it would never run; give it every_steps=N,"
      " every_secs=S, every_loop=True, at_end=True or on_stop=True"]


def test_config_file_without_a_config_or_missing_is_one_line(tmp_path,
                                                              parse):
  config = tmp_path / "no_get_config.py"
  config.write_text("from tests.fixtures import tiny\n")
  assert parse(f"--config={config}", f"--workdir={tmp_path}/run") == [
      f"looper: --config={config}: the file defines no get_config(); define"
      " get_config() returning the experiment's config, as"
      " experiments/mnist.py does"]
  returns_none = tmp_path / "returns_none.py"
  returns_none.write_text("from tests.fixtures import tiny\n\n"
                          "def get_config():\n"
                          "  c = tiny.get_config()\n")
  # Before it, ml_collections' warning (absl's notice, then its line).
  assert parse(f"--config={returns_none}", "--mode=describe")[-1] == (
      f"looper: --config={returns_none}: get_config() returned None; end it"
      " with `return` and the config")
  assert parse(f"--config={tmp_path}/typo.py", "--mode=describe") == [
      f"looper: --config={tmp_path}/typo.py: no such file; give the path of"
      " an experiment file, e.g. --config=experiments/mnist.py"]
