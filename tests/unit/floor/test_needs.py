"""tests/fixtures/needs.py: a missing extra skips only where its package is
absent, and fails under CI (LOOPER_CI=1); an installed one that breaks on
import fails, where pytest.importorskip would have skipped."""

import pytest

from tests.fixtures import needs


def test_an_absent_extra_skips_and_under_ci_fails(monkeypatch):
  monkeypatch.delenv("LOOPER_CI", raising=False)
  with pytest.raises(pytest.skip.Exception) as skipped:
    needs.extra("looper_absent_extra", "absent")
  assert str(skipped.value) == ("the absent extra is not installed: pip"
                                " install -e '.[absent]'")
  monkeypatch.setenv("LOOPER_CI", "1")
  with pytest.raises(pytest.fail.Exception) as failed:
    needs.missing("slurm: slurmd not installed")
  assert str(failed.value) == (
      "slurm: slurmd not installed; LOOPER_CI=1 (.ci/run) has it installed,"
      " so its absence is a failure")


def test_an_installed_extra_that_fails_to_import_fails(tmp_path,
                                                       monkeypatch):
  # What a protobuf older than the extra's generated code raises.
  clash = ("cannot import name 'runtime_version' from 'google.protobuf'")
  (tmp_path / "looper_broken_extra").mkdir()
  (tmp_path / "looper_broken_extra" / "__init__.py").write_text(
      f"raise ImportError({clash!r})\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delenv("LOOPER_CI", raising=False)
  with pytest.raises(pytest.skip.Exception):  # the old way hid it
    pytest.importorskip("looper_broken_extra", exc_type=ImportError)
  with pytest.raises(ImportError, match="runtime_version"):
    needs.extra("looper_broken_extra", "broken")
