"""The modes a run runs: what each reads and writes (`MODES`), and export.

Synopsis::

    from looper import modes
    modes.MODES["eval"].takes_checkpoint   # True: it reads --checkpoint
    modes.MODES["train"].reads("train", {"": "test"})  # ['train']: checked
    modes.start("train", restored=None, checkpoint_path=None)
    # 'fresh start': what the header says the mode starts from or reads
    shown, differs = modes.described("eval", config, wd)  # config.json's
    modes.export_checkpoint(ckpt, workdir, None, model=trainer.model,
                            serve=trainer.serve, step=trainer.step,
                            evaluator=evaluator, chief=True,
                            on_tpu=False)  # --mode=export
    out = modes.open_workdir(wd, references.to_json(config),
                             modes.MODES["train"], chief=True,
                             total_steps=config.train.steps,
                             eval_names=["accuracy"], input_hint="",
                             trackers=[])  # config.json, the writers

`looper.run.Run` runs them: every mode but export through a `Controller`
method (train, train_and_eval, evaluate, continuous_eval), export here
(restore one checkpoint, write its SavedModel: looper.workdir.export).
"""

import dataclasses
from typing import Callable

import ml_collections
import tensorflow as tf

from looper import config as config_lib
from looper import errors
from looper import references
from looper import workdir as workdir_lib
from looper.workdir import checkpoint
from looper.workdir import export
from looper.workdir import files
from looper.workdir import hparams
from looper.workdir import summaries


@dataclasses.dataclass(frozen=True)
class Mode:
  """What a mode reads and writes."""
  trains: bool  # resumes from the workdir's latest checkpoint and trains
  reads_eval_split: bool  # evaluates, or exports (the eval split's spec)
  takes_checkpoint: bool  # reads --checkpoint=PATH
  # Where its eval events go, of the workdir's; None: it writes none.
  eval_events: Callable[[workdir_lib.Workdir], str] | None

  def reads(self, train_split: str, eval_sets: dict[str, str]) -> list[str]:
    """The splits it reads, of `train_split` and `eval_sets` ({set name:
    split}), which the run checks before it writes anything
    (looper.measure.dry_run)."""
    return [train_split] * self.trains + list(eval_sets.values()) * (
        self.reads_eval_split)


MODES = {
    "train": Mode(trains=True, reads_eval_split=False,
                  takes_checkpoint=False, eval_events=None),
    "eval": Mode(trains=False, reads_eval_split=True, takes_checkpoint=True,
                 eval_events=lambda wd: wd.eval_events),
    "train_and_eval": Mode(trains=True, reads_eval_split=True,
                           takes_checkpoint=False,
                           eval_events=lambda wd: wd.eval_events),
    "continuous_eval": Mode(trains=False, reads_eval_split=True,
                            takes_checkpoint=False,
                            eval_events=lambda wd: wd.continuous_eval_events),
    "export": Mode(trains=False, reads_eval_split=True,
                   takes_checkpoint=True, eval_events=None),
}


def start(mode: str, restored: str | None,
          checkpoint_path: str | None) -> str:
  """What the header says the mode starts from or reads."""
  if MODES[mode].trains:
    return f"resumed from {restored}" if restored else "fresh start"
  if mode == "continuous_eval":
    return "evaluates each new checkpoint"
  verb = "exports" if mode == "export" else "evaluates"
  return f"{verb} {checkpoint_path or 'the latest checkpoint'}"


def described(mode: str, config: ml_collections.ConfigDict,
              wd: workdir_lib.Workdir) -> tuple[ml_collections.ConfigDict, str]:
  """(the config the header describes, where it and `config` differ): a
  mode that trains describes `config` (''); a reader of a trained run
  (eval, continuous_eval, export) what was trained, its config.json, and
  says where the command line's config differs (looper.config.differences);
  `config` too if the workdir holds none.
  """
  trained = None if MODES[mode].trains else files.read_json(wd.config)
  if trained is None:
    return config, ""
  return (ml_collections.ConfigDict(trained),
          config_lib.differences(config, trained))


def export_checkpoint(ckpt: checkpoint.Checkpointer, wd: workdir_lib.Workdir,
                      path: str | None, *, model, serve: Callable,
                      step: tf.Variable, evaluator, chief: bool,
                      on_tpu: bool) -> dict:
  """--mode=export: restores `path` (default: the latest) and exports
  `model` serving `serve` (looper.workdir.export); `step`: the update
  counter the checkpoint restores; `evaluator` (looper.train.evaluator):
  the example's spec and the weights eval sees."""
  restored = ckpt.restore(path)
  if not restored:
    raise errors.CheckpointError(
        f"--mode=export found no checkpoint in {ckpt.directory}; train"
        " first, or point --workdir at a trained run")
  result = {"step": int(step.numpy()), "checkpoint": restored}
  if chief:  # the other workers hold the same weights
    result["export"] = export.export(
        model, serve, wd, step=result["step"],
        spec=evaluator.example_spec(), weights=evaluator.averaged_weights,
        on_tpu=on_tpu)
  return result


def open_workdir(wd: workdir_lib.Workdir, config_json: str, mode: Mode,
                 chief: bool, *, total_steps: int, eval_names: list[str],
                 input_hint: str, trackers: list) -> summaries.Summaries:
  """config.json (training only: `config_json`, the run's config as
  references.to_json writes it) and the writers (`trackers`: the chief's;
  `total_steps`: train.steps), or one line."""
  table = hparams.Table.of(config_json,
                           references.to_json(config_lib.default_config()),
                           eval_names)
  try:
    if chief and mode.trains:
      with files.on_full_disk(wd.root, "config.json", wd.checkpoints):
        files.makedirs(wd.root)
        files.write_text(wd.config, config_json)
    return summaries.Summaries(
        wd, chief=chief, total_steps=total_steps, trains=mode.trains,
        eval_dir=mode.eval_events(wd) if mode.eval_events else None,
        table=table, input_hint=input_hint, trackers=tuple(trackers))
  except (tf.errors.OpError, OSError) as e:
    raise errors.unwritable_workdir(wd.root, e) from None
