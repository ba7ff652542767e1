"""What a sweep leaves for people: each trial's record, the best trial, the plots.

Synopsis::

    report.write_trial(folder, frozen_trial)   # DIR/trials/<n>/trial.json
    best = report.write_best(study, spec, command)  # DIR/best.json, or None
    report.plots(study, sweep_dir)   # DIR/plots/*.png (optuna.visualization)

`trial.json` (number, state, sampled values, objective, error) is what
`looper runs DIR` reads to show the trials as one table (no Optuna, no
database). `best.json` holds the best trial's number, objective, values,
folder and the command line that reproduces it. The plots are Optuna's
(optimization history, parameter importances, parallel coordinates),
drawn as PNG with matplotlib (plotly's PNG export needs a browser); a plot
Optuna cannot draw yet (one finished trial: no importances) is left out.
"""

import json
import os

import optuna

PLOTS = ("optimization_history", "param_importances", "parallel_coordinate")


def _write_json(path: str, record: dict) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(record, f, indent=1)
  os.replace(tmp, path)


def write_trial(folder: str, trial: optuna.trial.FrozenTrial,
                spec: dict) -> None:
  _write_json(os.path.join(folder, "trial.json"), {
      "number": trial.number, "state": trial.state.name.lower(),
      "params": trial.params, "objective": spec["objective"],
      "direction": spec["direction"], "value": trial.value,
      "error": trial.user_attrs.get("error")})


def write_best(study: optuna.Study, sweep_dir: str, objective: str,
               command) -> dict | None:
  """DIR/best.json of the best complete trial (None if none is);
  `command(trial)` is the command line that reproduces it."""
  complete = study.get_trials(deepcopy=False,
                              states=(optuna.trial.TrialState.COMPLETE,))
  if not complete:
    return None
  best = study.best_trial
  record = {"number": best.number, "objective": objective,
            "value": best.value, "params": best.params,
            "folder": os.path.join(sweep_dir, "trials",
                                   str(best.user_attrs.get("folder",
                                                           best.number))),
            "command": command(best)}
  _write_json(os.path.join(sweep_dir, "best.json"), record)
  return record


def plots(study: optuna.Study, sweep_dir: str) -> list[str] | None:
  """Writes DIR/plots/<name>.png for each of PLOTS Optuna can draw; None
  without matplotlib (the `sweep` extra installs it)."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  from optuna.visualization import matplotlib as vis  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  folder = os.path.join(sweep_dir, "plots")
  os.makedirs(folder, exist_ok=True)
  written = []
  for name in PLOTS:
    try:
      with warnings.catch_warnings():  # "experimental" on every call
        warnings.simplefilter("ignore")
        axes = getattr(vis, f"plot_{name}")(study)
    except (ValueError, RuntimeError, ZeroDivisionError):
      continue  # too few trials for it yet
    figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
    path = os.path.join(folder, f"{name}.png")
    figure.savefig(path, dpi=80, bbox_inches="tight")
    pyplot.close(figure)
    written.append(path)
  return written
