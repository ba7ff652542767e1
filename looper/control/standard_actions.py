"""The actions every run gets from its config, each made from what it uses.

Synopsis (what `looper.run.Run._build_actions` assembles)::

    report = [standard_actions.train_summaries(out),
              standard_actions.loop_end_hook(trainer.on_loop_end)]
    evaluate = [standard_actions.evaluations(eval_action, every_steps=1000)]
    save = [standard_actions.checkpoints(ckpt, every_steps=1000,
                                         every_secs=600),
            standard_actions.export_at_end(trainer.model, trainer.serve,
                                           evaluator, workdir, on_tpu=False),
            standard_actions.accounting(ledger, out)]
    controller.add_actions(report=report, evaluate=evaluate, save=save)

Each runs on every worker (`all_workers`: the writers are no-ops but on
the chief; a save and an evaluation are collectives). Each factory takes
what it uses as arguments (the Summaries writer, the Trainer's host hook,
the model and its serving function, a
`looper.control.eval_action.EvalAction`, the Checkpointer, a
`looper.measure.goodput.Ledger`) and returns one `looper.control.actions.Action`
(the profiler window is one already: looper.control.profiler.Window). The
groups run in that order after each loop: report (every loop), evaluate
(train_and_eval only), save (the user's actions, the checkpoint, the
profiler window, the export at the end, the trackers' deliveries, and last
the goodput accounting, which times the others).
"""

from typing import Callable

from looper import workdir as workdir_lib
from looper.control import actions
from looper.control import eval_action
from looper.measure import goodput
from looper.workdir import export
from looper.workdir import summaries


def train_summaries(out: summaries.Summaries) -> actions.Action:
  """Each loop's per-step values and logs to the train writer (events,
  metrics.jsonl, the progress line, the trackers); on a (re)start, what a
  killed run wrote past the step is dropped."""
  return actions.Action(
      lambda now: out.train(now.loop.first_step, now.loop.values,
                            now.loop.logs),
      every_loop=True, on_start=lambda now: out.purge_after(now.step),
      all_workers=True, name="train_summaries")


def loop_end_hook(hook: Callable[[int, dict], None]) -> actions.Action:
  """`hook(step, logs)` each loop: `Trainer.on_loop_end`, the host-side
  hook."""
  return actions.Action(
      lambda now: hook(now.step, now.loop.logs),
      every_loop=True, all_workers=True, name="on_loop_end")


def evaluations(evaluate: eval_action.EvalAction, *,
                every_steps: int) -> actions.Action:
  """An evaluation every `every_steps` and at the end; on a (re)start the
  evaluations past the step are forgotten. Its logs are the mode's
  result["eval"]."""
  return actions.Action(evaluate, every_steps=every_steps, at_end=True,
                        on_start=evaluate.resume, all_workers=True,
                        name="eval")


def checkpoints(ckpt, *, every_steps: int, every_secs: float
                ) -> actions.Action:
  """A save every `every_steps` / `every_secs`, at the end and on a stop
  (synchronously then: the process exits next). `ckpt`: a
  `looper.workdir.checkpoint.Checkpointer`."""

  def save(now: actions.Moment) -> None:  # no result of its own
    ckpt.save(now.step, sync=now.stopping)

  return actions.Action(save, every_steps=every_steps, every_secs=every_secs,
                        at_end=True, on_stop=True, all_workers=True,
                        name="checkpoint")


def export_at_end(model, serve: Callable, evaluator,
                  wd: workdir_lib.Workdir, *, on_tpu: bool) -> actions.Action:
  """The SavedModel of `model` at the last step (`export.at_end`), serving
  `serve`; `evaluator` (a looper.train.evaluator.Evaluator) gives the
  example's spec and the weights eval sees. Its path is the mode's
  result["export"]."""
  return actions.Action(
      lambda now: export.export(
          model, serve, wd, step=now.step, spec=evaluator.example_spec(),
          weights=evaluator.averaged_weights, on_tpu=on_tpu),
      at_end=True, all_workers=True, name="export")


def deliveries(trackers: list, ckpt) -> actions.Action:
  """After each loop, after the saves: each tracker (looper.trackers)
  sends what the newest complete checkpoint covers; on a (re)start, what
  a killed run had not sent, from metrics.jsonl. `ckpt`: the
  Checkpointer (its `durable_step`)."""

  def deliver(now: actions.Moment) -> None:
    for tracker in trackers:
      tracker.deliver(ckpt.durable_step)

  def start(now: actions.Moment) -> None:
    for tracker in trackers:
      tracker.start(now.step)

  return actions.Action(deliver, every_loop=True, on_start=start,
                        name="trackers")


def accounting(ledger: goodput.Ledger, out: summaries.Summaries
               ) -> actions.Action:
  """The last action after each loop: the loop's and the actions' time to
  the goodput ledger, its totals to TensorBoard when it writes them."""

  def account(now: actions.Moment) -> None:
    loop = now.loop
    ledger.loop(loop.first_step, len(loop.losses), loop.seconds,
                loop.logs.get("input_wait_fraction", 0.0))
    for name, seconds in now.spent.items():
      ledger.add(name, seconds)
    # The last record is close()'s, after the final save's wait.
    totals = None if now.end or now.stopping else ledger.write()
    if totals:
      out.goodput(now.step, totals.fractions())

  return actions.Action(account, every_loop=True,
                        on_start=lambda now: ledger.start(now.step),
                        all_workers=True, name="goodput")
