"""The top of the package: the public names, and nothing else.

`import looper` must stay free of TensorFlow (`looper launch` and the
Controller import it); an old module path (0.x moved many) is no longer
there: it fails as any missing module does.
"""

import subprocess
import sys

import pytest

import looper
from looper.cli import launch
from looper.control import actions
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


def test_an_old_module_path_is_gone():
  with pytest.raises(ModuleNotFoundError,
                     match="No module named 'looper.launch'"):
    import looper.launch  # pylint: disable=import-outside-toplevel,unused-import
