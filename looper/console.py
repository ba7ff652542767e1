"""What a run prints: a quiet TensorFlow start, a header, a closing summary.

Synopsis::

    # looper/main.py, before anything imports TensorFlow:
    console.start(verbose=console.wants_tensorflow_logs(sys.argv))
    ...
    # looper.run.run, called from plain Python or a notebook too:
    with console.printing(verbose):
      ...
    logging.info("%s", console.header(
        strategy, workdir, mode, "fresh start", model, batch, config.train,
        config.eval, config.checkpoint, config.distribution))
    logging.info("%s", console.summary(result, workdir, seconds, ...))
    # looper/main.py, before its one error line:
    console.expect_partial_restores(error)

The first screen of a run is looper's: TensorFlow's C++ start-up lines
(oneDNN, "Could not find cuda drivers", a cuInit error on a machine without
a GPU, absl's "before InitializeLog" notice) are printed by C++ straight to
file descriptor 2 before any log level applies, so `start` imports
TensorFlow and lists its devices with fd 2 pointed at a temporary file,
and shows that file only if the import fails. `--verbosity=1` (absl's flag,
`-v 1`) keeps everything, TensorFlow's INFO logs included.

The lines are absl's log lines: `looper.main` (an absl app) shows them on
stderr. Plain Python and a notebook set up no logging, so `printing` shows
them on stdout there, as Keras' `fit` prints its progress, for the length
of a `looper.run.run` call.
"""

import collections
import contextlib
import datetime
import logging as std_logging
import os
import sys
import tempfile

from looper import workdir as workdir_lib  # no TensorFlow: safe before start


def wants_tensorflow_logs(argv: list[str]) -> bool:
  """True if `argv` asks for --verbosity >= 1 (absl's flag, also -v N)."""
  for i, arg in enumerate(argv):
    value = None
    if arg.startswith(("--verbosity=", "-v=")):
      value = arg.split("=", 1)[1]
    elif arg in ("--verbosity", "-v") and i + 1 < len(argv):
      value = argv[i + 1]
    if value is not None:
      try:
        return int(value) >= 1
      except ValueError:
        return False
  return False


def start(verbose: bool) -> None:
  """Imports TensorFlow and finds its devices, quietly unless `verbose`."""
  if verbose:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.list_physical_devices()
    return
  # C++ INFO and WARNING lines after start-up stay hidden too.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.config.list_physical_devices()  # the cuInit attempt happens here
    except BaseException:
      os.dup2(saved, 2)
      captured.seek(0)
      sys.stderr.write(captured.read().decode(errors="replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)
  # TensorFlow's Python INFO lines ("Sharding callback duration") too.
  std_logging.getLogger("tensorflow").setLevel(std_logging.WARNING)


class _ShortFormatter(std_logging.Formatter):
  """'12:03:04 message'; 'WARNING:' or 'ERROR:' before the message if so."""

  def format(self, record):
    level = ("" if record.levelno <= std_logging.INFO
             else f"{record.levelname}: ")
    return f"{self.formatTime(record, '%H:%M:%S')} {level}{record.getMessage()}"


def _not_library_info(record) -> bool:
  """Drops INFO lines TensorFlow and Keras log through absl ("Sharding
  callback duration", "Writing fingerprint"); their warnings stay."""
  library = f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}"
  return (record.levelno > std_logging.INFO or
          not any(part in record.pathname for part in library))


def short_log_lines() -> None:
  """absl's log lines without their file:line and thread prefix, and
  without the libraries' INFO lines."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  handler = logging.get_absl_handler()
  handler.setFormatter(_ShortFormatter())
  handler.addFilter(_not_library_info)


def _shown(logger) -> bool:
  """Whether `logger`'s INFO records already reach a handler that shows
  them (absl.app's, looper.main's, the caller's logging.basicConfig)."""
  if not logger.isEnabledFor(std_logging.INFO):
    return False
  node = logger
  while node is not None:
    if any(h.level <= std_logging.INFO for h in node.handlers):
      return True
    node = node.parent if node.propagate else None
  return False


@contextlib.contextmanager
def printing(verbose: bool):
  """looper's log lines on stdout for the block, in the command line's
  short format, where nothing else shows them: a plain Python process or a
  notebook, whose logging has no handler (absl's INFO lines would be
  dropped, its warnings printed bare). Nothing changes where they are shown
  already (looper.main: no line twice), where the caller set absl's level
  above INFO (`absl.logging.set_verbosity("warning")`), or if not `verbose`.
  """
  from absl import logging  # pylint: disable=g-import-not-at-top
  logger = logging.get_absl_logger()
  if not verbose or logger.level > std_logging.INFO or _shown(logger):
    yield
    return
  handler = std_logging.StreamHandler(sys.stdout)
  handler.setFormatter(_ShortFormatter())
  handler.addFilter(_not_library_info)
  level, propagate = logger.level, logger.propagate
  logger.addHandler(handler)
  logger.setLevel(level or std_logging.INFO)
  # A root handler that shows only warnings (`logging.basicConfig()` at
  # its default level) would print those a second time.
  logger.propagate = False
  try:
    yield
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def expect_partial_restores(error: BaseException) -> None:
  """Marks the checkpoint restores `error` cut short as expected partial.

  A restore that fails (a workdir holding a different model: a shape
  mismatch) raises before it returns the status whose `expect_partial()`
  would say so, and TensorFlow's record of it lives on in the frames of
  the error's traceback. Deleted at exit, after looper's one line, it logs
  "deleted with unrestored values" warnings; marked here, it does not.
  """
  from looper import compat  # pylint: disable=g-import-not-at-top
  chain, seen = [error], set()
  while chain:
    e = chain.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    chain += [e.__cause__, e.__context__]
    tb = e.__traceback__
    while tb is not None:
      for value in tb.tb_frame.f_locals.values():
        compat.mark_expected_partial(value)  # TensorFlow's private record
      tb = tb.tb_next


def header(strategy, workdir: str | None, mode: str, start: str | None,
           model, batch, train, evaluation, checkpoint, distribution, *,
           peak=None, epoch=None, note: str | None = None,
           state: int | None = None, differs: str = "") -> str:
  """The lines that open a run: what runs where (`start`: from where it
  starts, or what it reads), with which batch (`batch`, the run's
  `looper.data.batch.Batch`), how many epochs the steps are (of `epoch`, a
  `looper.control.epochs.Epoch`, if the train split's size is known), the
  peak (a `looper.measure.peak_flops.Peak`) the MFU is of (the train
  rows' detail line at --verbosity=1), and a `note` on what the run
  cannot promise (looper.train.randomness);
  `state`: the optimizer state's bytes per device (Trainer's).

  What it prints of a config, from its blocks: `train`'s steps,
  steps_per_loop, precision and jit_compile, `evaluation`'s and
  `checkpoint`'s every_steps and `distribution`'s shard_optimizer: the
  run's, or what an evaluator or export describes, what was trained (its
  config.json: looper.modes.described); `differs`, where that config.json
  and the command line's config differ and where each value in use came
  from (looper.config.differences).
  """
  replicas = strategy.num_replicas_in_sync
  name = type(strategy).__name__.replace("Strategy", "")
  name = "default" if name.startswith("_Default") else name
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    types = collections.Counter(
        tf.DeviceSpec.from_string(d).device_type
        for d in strategy.extended.worker_devices)
    devices = [f"{n} {kind}" for kind, n in sorted(types.items())]
  except RuntimeError:  # the default strategy: wherever TF places ops
    types = {"GPU": 1} if tf.config.list_physical_devices("GPU") else {}
    devices = ["default device"]
  accum = batch.accum_steps
  where = f" in {workdir} ({start})" if workdir else ""
  lines = [
      f"looper {mode}: {model.name} ({model.count_params():,} parameters)"
      f"{where}",
      f"  strategy   {name}, {replicas} replica{'s' * (replicas > 1)}"
      f" ({', '.join(devices)})",
      f"  batch      {batch.micro_batch_size} global = {batch.per_replica}"
      f" per replica x {replicas}" + (f", {accum} micro-batches per update"
                                      if accum > 1 else "") +
      f"; eval {batch.eval_batch_size}",
      f"  steps      {train.steps}{_in_epochs(train.steps, epoch)},"
      f" {train.steps_per_loop} per loop; eval every"
      f" {evaluation.every_steps or 'end'}, checkpoint every"
      f" {checkpoint.every_steps or 'end'}",
      f"  precision  {train.precision}"
      f"{', XLA per step' if train.jit_compile else ''}",
  ]
  from looper.options import precision  # pylint: disable=g-import-not-at-top
  slower = precision.slower_here(train.precision,
                                 accelerated=bool({"GPU", "TPU"} & set(types)))
  if slower:
    lines[-1] += f" (slower here: {slower})"
  from looper.workdir import formats  # pylint: disable=g-import-not-at-top
  if state is not None:
    size = "{} {}B".format(*formats.si(state))
    lines.append(f"  memory     optimizer state {size} per device" + (
        f" (sharded over {replicas} replicas)"
        if distribution.shard_optimizer and replicas > 1 else ""))
  if peak:
    lines.append(f"  MFU        of {formats.flops(peak.flops_per_sec)}:"
                 f" {peak.source}")
  if note:
    lines.append(f"  note       {note}")
  if differs:
    lines.append(f"  differs    {differs}")
  return "\n".join(lines)


def _in_epochs(steps: int, epoch) -> str:
  """' = 1.003 epochs of 60,000' (the steps' epochs), or '' if unknown."""
  if epoch is None:
    return ""
  n = epoch.of(steps)
  number = f"{n:.4g}" if n < 1000 else f"{n:,.0f}"
  return f" = {number} epoch{'s' * (number != '1')} of {epoch}"


def summary(result: dict, workdir: workdir_lib.Workdir, seconds: float, *,
            best: tuple[str, int, float] | None, checkpoint: str | None,
            export: str | None, goodput: str | None = None,
            trackers: list[tuple[str, str]] = ()) -> str:
  """The lines that close a run: what it reached and where things are;
  `seconds` is this attempt's wall time (looper.measure.goodput: from its
  process' start, or the call of run.run), which the first line says;
  `trackers`: (name, what it holds) of each (looper.trackers)."""
  from looper.workdir import formats  # pylint: disable=g-import-not-at-top
  from looper.workdir import lines as shown  # pylint: disable=g-import-not-at-top
  ended = result.get("stopped") or result.get("ended")
  lines = [f"looper done: step {result['step']} in"
           f" {datetime.timedelta(seconds=round(seconds))} (this attempt's"
           f" wall time{f'; {ended}' if ended else ''})"]
  if result.get("eval"):
    lines += shown.evaluation(result["eval"], "  last eval   ", timed=False)
  if best:
    metric, step, value = best
    lines.append(f"  best eval   {metric} {formats.figure(value)} at step"
                 f" {step}")
  if checkpoint:
    lines.append(f"  checkpoint  {checkpoint}")
  lines.append(f"  events      {workdir.train_events},"
               f" {workdir.eval_events}")
  if export:
    lines.append(f"  export      {export}")
  if goodput:
    lines.append(f"  goodput     {goodput}")
  lines += [f"  {name:<12}{line}" for name, line in trackers]
  lines.append(f"  tensorboard --logdir={workdir.root}")
  return "\n".join(lines)
