"""The top of the package: the public names and the old module paths.

`import looper` must stay free of TensorFlow (`looper launch` and the
Controller import it); an old path keeps working as the same module with
one warning naming the new one, and a split module fails in one line.
"""

import subprocess
import sys
import warnings

import pytest

import looper
from looper.cli import launch
from looper.train import actions
from looper.train import trainer


def test_the_public_names_are_the_modules_own():
  assert looper.Trainer is trainer.Trainer
  assert looper.Action is actions.Action
  assert looper.Moment is actions.Moment
  with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
    looper.Trainr  # pylint: disable=pointless-statement


def test_import_looper_starts_no_tensorflow():
  code = ("import sys, looper, looper.cli.launch; "
          "print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True, timeout=120)
  assert out.stdout.strip() == "False"


def test_an_old_path_is_the_new_module_with_one_warning():
  sys.modules.pop("looper.launch", None)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from looper import launch as old  # pylint: disable=import-outside-toplevel
  assert old is launch
  assert old.__spec__.name == "looper.cli.launch"
  assert [str(w.message) for w in caught] == [
      "looper.launch moved to looper.cli.launch; import that"]
  # Every old path names a module that exists.
  for new in looper.MOVED.values():
    assert __import__(new, fromlist=["_"]).__name__ == new


def test_a_split_module_names_where_its_parts_went():
  with pytest.raises(ImportError) as e:
    import looper.train.objectives  # pylint: disable=import-outside-toplevel,unused-import
  assert str(e.value) == (
      "looper.train.objectives was split; import looper.options.losses"
      " (losses, their average, EvalLoss) and looper.options.metrics"
      " (Metrics)")
