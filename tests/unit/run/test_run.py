"""The Run: a subclass that overrides one `_build_*` method changes that
piece of a real run and nothing else."""

import numpy as np
import pytest

from looper import run
from looper.workdir import checkpoint
from tests.fixtures import tiny
from tests.fixtures.configs import configured
from tests.fixtures.events import curve

# Two tiny runs in this process, seconds each: the slow lane (BUILD.md).
pytestmark = pytest.mark.slow


class KeepOneRun(run.Run):
  """Changes one piece: a checkpointer that keeps only the newest save."""
  built = []

  def _build_checkpointer(self, guard):
    KeepOneRun.built.append(self.config.train.steps)
    return checkpoint.Checkpointer(
        self.workdir, self.trainer.checkpoint_items(), keep=1,
        chief=self.chief, task_id=0, guard=guard)


def test_a_run_subclass_changes_the_piece_it_builds_and_nothing_else(
    tmp_path):
  def config():  # 40 steps; a save every 10: four of them
    return configured(tiny.get_config(), checkpoint__every_steps=10)

  plain = run.run(config(), str(tmp_path / "plain"), "train_and_eval",
                  verbose=False)
  changed = KeepOneRun(config(), str(tmp_path / "one"), "train_and_eval")
  # Built and checked up to the evaluator: nothing written yet.
  assert not (tmp_path / "one").exists() and not KeepOneRun.built
  result = changed.run()
  assert KeepOneRun.built == [40]  # built once
  saved = lambda name: sorted(
      p.name for p in (tmp_path / name / "checkpoints").glob("*.index"))
  assert saved("plain") == ["ckpt-20.index", "ckpt-30.index",
                            "ckpt-40.index"]  # checkpoint.keep=3
  assert saved("one") == ["ckpt-40.index"]
  # The rest of the run is the plain one's, bit for bit.
  np.testing.assert_array_equal(curve(tmp_path / "one" / "train"),
                                curve(tmp_path / "plain" / "train"))
  assert result["eval"] == plain["eval"] and result["step"] == 40
  # Every other piece is there, built once, as a run builds it.
  assert changed.controller.checkpointer is changed.checkpointer
  assert changed.trainer.input is changed.input is changed.evaluator.input
  assert changed.input.batch is changed.batch is changed.controller.batch
