"""`looper sweep`: a hyperparameter study of looper runs, on Optuna (docs/pages/sweeps.md).

Synopsis::

    looper sweep --config=exp.py --workdir=/tmp/sweep --trials=20 \
        [--parallel=2] [--seed=0] [--storage=postgresql://...] \
        [--config.train.steps=2000 ...]     # applied to every trial
    python -m looper.cli.sweep ...          # the same

The experiment file declares `get_sweep()` (looper.sweep.space). Each trial
is a looper run in DIR/trials/<number> (looper.sweep.worker); the study is
DIR/study.db unless --storage names another. The sweep ends with its best
trial and the command that reproduces it, and writes DIR/best.json and
DIR/plots/. This process imports no TensorFlow: the space is read in a
child (looper.sweep.spec), and each trial is a process of its own.
"""

import os
import shlex
import sys

from absl import flags

from looper.cli import parsing
from looper.errors import ConfigError

FLAGS = flags.FlagValues()
flags.DEFINE_string("config", None, "Experiment file (with get_config and"
                    " get_sweep).", flag_values=FLAGS)
flags.DEFINE_string("workdir", None, "The sweep's folder: trials/<n>,"
                    " study.db, best.json, plots/.", flag_values=FLAGS)
flags.DEFINE_integer("trials", None, "Finished trials (complete, pruned or"
                     " failed) the study should hold, by all workers.",
                     flag_values=FLAGS)
flags.DEFINE_integer("parallel", 1, "Trials at once on this machine.",
                     flag_values=FLAGS)
flags.DEFINE_integer("devices_per_trial", 1, "GPUs per trial (with GPUs).",
                     flag_values=FLAGS)
flags.DEFINE_integer("seed", None, "Seeds the sampler (per trial number).",
                     flag_values=FLAGS)
flags.DEFINE_enum("sampler", "tpe", ["tpe", "random", "grid"], "Optuna's"
                  " sampler.", flag_values=FLAGS)
flags.DEFINE_enum("pruner", "median", ["median", "hyperband",
                                       "successive_halving", "none"],
                  "Optuna's pruner, asked at each evaluation.",
                  flag_values=FLAGS)
flags.DEFINE_integer("pruner_startup_trials", 5, "--pruner=median: trials"
                     " that finish before any is pruned.", flag_values=FLAGS)
flags.DEFINE_string("storage", None, "The study's storage: an SQLAlchemy URL"
                    " (postgresql://...) or a .journal file; default"
                    " DIR/study.db.", flag_values=FLAGS)
flags.DEFINE_string("study", None, "The study's name (default: the"
                    " workdir's name).", flag_values=FLAGS)
flags.DEFINE_integer("max_failures", 3, "Failed trials in a row that stop"
                     " the sweep.", flag_values=FLAGS)
flags.DEFINE_float("lease_secs", 60, "A worker on another host that has not"
                   " renewed its claim for this long is gone.",
                   flag_values=FLAGS)
flags.DEFINE_float("slurm_margin_secs", 0, "Under Slurm: save, stop and"
                   " requeue this long before the job's end time (0: only on"
                   " SIGUSR1).", flag_values=FLAGS)
flags.DEFINE_string("starter", None, "How trials start: MODULE:NAME of a"
                    " starter (looper.sweep.trials); default a subprocess.",
                    flag_values=FLAGS)
USAGE = ("usage: looper sweep --config=EXPERIMENT.py --workdir=DIR"
         " --trials=N [--config.FIELD=VALUE ...]")


def _options(overrides):
  from looper.sweep import worker  # pylint: disable=g-import-not-at-top
  for name in ("config", "workdir", "trials"):
    if FLAGS[name].value is None:
      raise ConfigError(f"--{name} is required; {USAGE[len('usage: '):]}")
  for name in ("trials", "parallel", "devices_per_trial", "max_failures"):
    if FLAGS[name].value < 1:
      raise ConfigError(f"--{name}={FLAGS[name].value}: give at least 1")
  return worker.Options(
      config=FLAGS.config, sweep_dir=os.path.abspath(FLAGS.workdir),
      overrides=overrides, trials=FLAGS.trials, parallel=FLAGS.parallel,
      devices_per_trial=FLAGS.devices_per_trial, seed=FLAGS.seed,
      sampler=FLAGS.sampler, pruner=FLAGS.pruner,
      max_failures=FLAGS.max_failures, lease_secs=FLAGS.lease_secs,
      slurm_margin_secs=FLAGS.slurm_margin_secs)


def sweep(overrides: list[str]) -> int:
  """The sweep the parsed FLAGS describe; ConfigError: one line."""
  from looper.sweep import trials  # pylint: disable=g-import-not-at-top
  o = _options(overrides)
  os.makedirs(os.path.join(o.sweep_dir, "trials"), exist_ok=True)
  starter = trials.load_starter(FLAGS.starter)
  try:
    return _sweep(o, overrides, starter)
  finally:
    if hasattr(starter, "close"):
      starter.close()


def _sweep(o, overrides: list[str], starter) -> int:
  # pylint: disable=g-import-not-at-top
  from looper.sweep import report
  from looper.sweep import space
  from looper.sweep import spec as spec_lib
  from looper.sweep import study as study_lib
  from looper.sweep import trials
  from looper.sweep import worker
  # pylint: enable=g-import-not-at-top
  slots = trials.slots(o.parallel, o.devices_per_trial)
  for slot in slots:  # each slot's first trial imports while the space is read
    trials.prepare(starter, slot)
  spec = spec_lib.read(o.config, overrides, starter, o.sweep_dir)
  swept = space.swept_overrides(spec["space"], overrides)
  if swept:
    raise ConfigError(f"{swept[0]}: that field is swept (get_sweep's space);"
                      " drop the override, or the field from the space")
  storage = study_lib.open_storage(FLAGS.storage, o.sweep_dir)
  name = FLAGS.study or os.path.basename(o.sweep_dir)
  study = study_lib.load(storage, name, spec, sampler=o.sampler, seed=o.seed,
                         pruner=o.pruner,
                         pruner_startup=FLAGS.pruner_startup_trials)
  w = worker.Worker(study, storage, spec, o, starter, slots)
  code = w.run()

  def command(trial) -> str:
    folder = w.folder(trial.user_attrs.get("folder", trial.number))
    return "looper train_and_eval " + shlex.join(w.command(folder,
                                                           trial.params)[4:])
  counts = {}
  for t in study.get_trials(deepcopy=False):
    counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
  worker.say(f"study {name}: " + ", ".join(f"{n} {s}" for s, n in
                                         sorted(counts.items())))
  best = report.write_best(study, o.sweep_dir, spec["objective"], command)
  if best is not None:
    worker.say(f"best: trial {best['number']}, {spec['objective']}="
               f"{best['value']:.4g}; {o.sweep_dir}/best.json; reproduce:"
               f" {best['command']}")
  drawn = report.plots(study, o.sweep_dir)
  plots = (f"plots in {o.sweep_dir}/plots" if drawn is not None else
           "no plots: pip install matplotlib (the sweep extra)")
  worker.say(f"looper runs {o.sweep_dir}; {plots}; optuna-dashboard"
             f" {study_lib.storage_url(FLAGS.storage, o.sweep_dir)}")
  return code


def main(argv=None) -> int:
  """`looper sweep ...`; returns the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)
  overrides = [a for a in argv if a.startswith("--config.")]
  parsing.parse_tool_flags([a for a in argv if a not in overrides], FLAGS,
                           USAGE, None)
  try:
    return sweep(overrides)
  except (ConfigError, ValueError) as e:
    print(f"looper sweep: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
