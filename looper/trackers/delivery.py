"""A tracker's points go out once a complete checkpoint covers their step: exact across restarts.

Synopsis (what `looper.run.Run` does with each tracker)::

    tracker.open(params)            # before training: its run made, or the
                                    # run kept in the workdir resumed
    tracker.write_scalars(step, {"train/loss": 0.3})   # a writer: pending
    tracker.start(step)             # training (re)starts at `step`
    tracker.deliver(ckpt.durable_step)   # after each loop: what is covered
    tracker.close(ckpt.durable_step, figures={...}, status="FINISHED")

Why (issue 38): a tracker keeps every point it is sent (MLflow keeps both
values of a step logged twice, and deletes none), so a point sent for a
step that a kill -9 then makes the run train again would stay beside the
replayed one. So a point is pending until a complete checkpoint covers its
step (`Checkpointer.durable_step`: with async_save, once the save ended);
then it is sent. Its step is then never trained again.

What makes it exact across a kill at any moment, with the tracker's state
`Workdir.tracker(name)` (`{"run_id", "delivered", "sending", "final"}`):
- before a send, `sending` = the steps [first, last] it holds; after it,
  `delivered` = last and `sending` is cleared;
- a restart reads metrics.jsonl (`looper.workdir.jsonl`: cut back to the
  restored step first) and sends again the lines of steps after
  `delivered`: every scalar of a step trained before the kill, once;
- if the kill came mid-send (`sending` is set), the first send asks the
  tracker which of those points it holds (`held`) and leaves them out.
A tracker that takes a point before it holds it (W&B: its own process
writes it later) sets `delivered` and `sending` from what it holds as it
opens, on every restart (looper.trackers.wandb).

Images, histograms and texts are not in metrics.jsonl: each one of a kind
the tracker keeps (`KEEPS`) is also kept in the workdir as it is written
(looper.workdir.spool) until the tracker is known to hold it: once its
send returned (`HELD_ON_SEND`: MLflow's calls are synchronous), else once
the tracker's own record shows it (W&B's files, read at a restart) or
the run was closed. A restart makes the kept ones of the steps up to the
restored one pending again, asking the tracker first which it holds
(`held`), and drops the later ones (trained, so written, again).

A tracker failing mid-run never stops training: its points stay pending
and go with the next delivery; one warning line when it starts failing,
and `close` says what was not delivered (a rerun with the tracker back
sends the scalars: they are in metrics.jsonl).
"""

import contextlib
import dataclasses
import time
from typing import Any

from absl import logging
import numpy as np

from looper import errors
from looper import workdir as workdir_lib
from looper.workdir import files
from looper.workdir import jsonl
from looper.workdir import spool
from looper.workdir import writers


@dataclasses.dataclass
class Point:
  """What was written at one step, of one kind: sent together."""
  step: int
  kind: str  # scalars | images | histograms | texts | figures (the final ones)
  values: dict[str, Any]
  time: float  # seconds since the epoch (a line's own, when replayed)
  buckets: dict[str, int] | None = None  # histograms'
  kept: str = ""  # its file in the spool (a kind the tracker KEEPS)


class Tracker(writers.Writer):
  """The delivery every tracker shares; a subclass talks to its service.

  A subclass sets `name` and `KEEPS` and implements `_open`, `_params`,
  `_send`, `_held` (if the service can say) and `_finish`.
  """
  name = ""
  KEEPS: tuple[str, ...] = ()  # the kinds besides scalars it keeps
  HELD_ON_SEND = True  # a send that returned is held (else: once closed)

  def __init__(self, wd: workdir_lib.Workdir, group: str = ""):
    self._wd = wd
    self._group = group  # the runs' group (looper.trackers), '' none
    self._file = files.JsonFile(wd.tracker(self.name), wd.checkpoints)
    self._state = {"run_id": None, "delivered": 0, "sending": None,
                   "final": None}
    self._pending: list[Point] = []
    self._spool = spool.Spool(wd.tracker_media(self.name), wd.checkpoints)
    self._handed: list[str] = []  # kept points sent, not yet known held
    self._loaded = False  # metrics.jsonl's undelivered lines are pending
    self._failing = None  # the last send's error, while sends fail
    self._opened = False
    self.sent = 0  # writes (a step's of one kind) sent by this process

  # --- What a subclass implements ---------------------------------------------

  def _open(self, run_id: str | None, params: dict[str, str]) -> str:
    """Makes the run (`run_id` None) or resumes it; its id. `params`: the
    config's fields, flat: a new run's params; a resumed run's changed
    ones are the subclass' to record (`_params`)."""
    raise NotImplementedError

  def _params(self, params: dict[str, str]) -> None:
    """Records `params` in the open run (new fields, changed ones)."""
    raise NotImplementedError

  def _send(self, points: list[Point]) -> None:
    """Sends `points` (step order); raises if the service refused."""
    raise NotImplementedError

  def _held(self, points: list[Point]) -> set[tuple[str, int]] | None:
    """(name, step) of the values among `points` the run already holds (a
    text it would replace need not be named); None: it cannot say."""
    del points
    return None

  def _finish(self, status: str) -> None:
    """Ends this process' use of the run: FINISHED, KILLED (stopped, to be
    resumed) or FAILED."""
    raise NotImplementedError

  def where(self) -> str:
    """Where the run is, for the closing line."""
    return f"run {self._state['run_id']}"

  # --- A writer: what is written waits for its checkpoint ----------------------

  def write_scalars(self, step, scalars):
    self._add(step, "scalars", {k: float(v) for k, v in scalars.items()})

  def write_images(self, step, images):
    self._add(step, "images", {k: np.asarray(v) for k, v in images.items()})

  def write_histograms(self, step, arrays, num_buckets=None):
    self._add(step, "histograms",
              {k: np.asarray(v) for k, v in arrays.items()}, num_buckets)

  def write_texts(self, step, texts):
    self._add(step, "texts", dict(texts))

  def write_hparams(self, hparams):
    self._call(lambda: self._params({k: str(v) for k, v in hparams.items()}),
               "could not record hparams")

  def _add(self, step, kind, values, buckets=None):
    if values:
      point = Point(int(step), kind, values, time.time(), buckets)
      if kind in self.KEEPS:
        point.kept = self._spool.put(point.step, kind, values, buckets,
                                     time=point.time)
      self._pending.append(point)

  # --- The run's calls ----------------------------------------------------------

  def open(self, params: dict[str, str]) -> None:
    """Makes or resumes the run (its id kept in the workdir), before
    training; a failure here is one line (the service was reachable a
    moment ago: looper.trackers.build)."""
    saved = self._file.read()
    if saved:
      self._state.update(saved)
    try:
      run_id = self._open(self._state["run_id"], params)
    except Exception as e:  # pylint: disable=broad-except
      raise errors.ConfigError(
          f"config.trackers={self.name!r}: could not open its run"
          f" ({errors.first_line(e)}); fix it, or drop {self.name} from"
          " --config.trackers") from None
    if run_id != self._state["run_id"]:
      self._state.update(run_id=run_id, delivered=0, sending=None,
                         final=None)
    self._save()
    self._opened = True

  def start(self, step: int) -> None:
    """Training starts, resumes or rolls back at `step`, a restored (or
    the first) step: the points past it are dropped (trained again), the
    undelivered ones before it sent."""
    if not self._loaded:
      self._load(step)
    self._spool.remove(*[p.kept for p in self._pending
                         if p.step > step and p.kept])
    self._pending = [p for p in self._pending if p.step <= step]
    self.deliver(step)

  def deliver(self, durable: int | None) -> None:
    """Sends every pending point of a step up to `durable` (a complete
    checkpoint's step); keeps them if the service fails."""
    if durable is None:
      return
    if not self._loaded:
      self._load(durable)
    ready = [p for p in self._pending if p.step <= durable]
    if not ready:
      return
    first, last = ready[0].step, max(p.step for p in ready)
    doubt = self._state["sending"]
    self._state["sending"] = [min(first, doubt[0]) if doubt else first,
                              max(last, doubt[1]) if doubt else last]
    self._save()
    sent = []

    def send():
      sent[:] = self._not_held(ready, doubt)
      self._send(sent)

    if not self._call(send, "could not deliver", sending=True):
      return
    self._pending = [p for p in self._pending if p.step > durable]
    # Held: what was sent (HELD_ON_SEND), and what the run held already.
    handed = {p.kept for p in sent}
    self._spool.remove(*[p.kept for p in ready if p.kept and (
        self.HELD_ON_SEND or p.kept not in handed)])
    if not self.HELD_ON_SEND:
      self._handed += [path for path in handed if path]
    self.sent += len(ready)
    self._state.update(delivered=max(self._state["delivered"], last),
                       sending=None)
    if any(p.kind == "figures" for p in ready):
      self._state["final"] = last
    self._save()

  def close(self, durable: int | None, *, figures: dict[str, float] | None,
            status: str) -> str:
    """The last delivery (with the run's final `figures` at `durable`, if
    it finished and they were not sent yet), then the run's end; returns
    its closing line: where the run is, what was not delivered."""
    if not self._opened:  # the run failed before (or in) `open`
      return "its run was not opened"
    if figures and durable is not None and self._state["final"] != durable:
      self._add(durable, "figures", figures)
    self.deliver(durable)
    if self._failing:  # away: said once, the closing line says the rest
      with contextlib.suppress(Exception):  # its status waits for the rerun
        self._finish(status)
    elif self._call(lambda: self._finish(status),
                    f"could not mark its run {status}"):
      self._spool.remove(*self._handed)  # its run closed: held
      self._handed = []
    if not self._pending:
      return f"{self.where()}: {self.sent} writes sent"
    steps = sorted({p.step for p in self._pending})
    why = self._failing or "no complete checkpoint covers them"
    return (f"{self.where()}: {len(self._pending)} writes of steps"
            f" {steps[0]}-{steps[-1]} NOT delivered ({why}); rerun the same"
            " command to send them (the workdir keeps them)")

  # --- Helpers ------------------------------------------------------------------

  def _load(self, upto: int) -> None:
    """The lines of metrics.jsonl after the delivered step, up to `upto`,
    and the spool's points up to `upto`, as pending points (a restart:
    they were, or may have been, lost); the spool's later ones dropped."""
    self._loaded = True
    delivered = self._state["delivered"]
    mine = {p.kept for p in self._pending}
    kept = [e for e in self._spool.read() if e.path not in mine]
    self._spool.remove(*[e.path for e in kept if e.step > upto])
    kept = [Point(e.step, e.kind, e.values, e.time, e.buckets, e.path)
            for e in kept if e.step <= upto]
    self._pending = sorted([
        Point(line["step"], "scalars", jsonl.named(line), line["time"])
        for line in jsonl.read(self._wd.metrics)
        if line["kind"] in jsonl.PREFIXES and delivered < line["step"] <= upto
    ] + kept + self._pending, key=lambda p: p.step)
    if kept:  # the run may hold them: the first send asks (`_not_held`)
      doubt = self._state["sending"] or [kept[0].step, kept[-1].step]
      self._state["sending"] = [min(doubt[0], kept[0].step),
                                max(doubt[1], kept[-1].step)]

  def _not_held(self, ready: list[Point], doubt: list[int] | None
                ) -> list[Point]:
    """`ready` without the values the run already holds of the steps
    `doubt`: a send a kill interrupted, the spool's points."""
    if not doubt:
      return ready
    inside = [p for p in ready if doubt[0] <= p.step <= doubt[1]]
    held = (self._held(inside) if inside else None) or set()
    out = []
    for p in ready:
      values = {k: v for k, v in p.values.items() if (k, p.step) not in held
                or not doubt[0] <= p.step <= doubt[1]}
      if values:
        out.append(dataclasses.replace(p, values=values))
    return out

  def _call(self, fn, failed: str, sending: bool = False) -> bool:
    """`fn()`; whether it succeeded. A failure is a warning line, once
    while sends keep failing (`sending`: the error is kept for the closing
    line)."""
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      if not (sending and self._failing):
        logging.warning("%s: %s (%s); training goes on%s", self.name, failed,
                        errors.first_line(e),
                        ", its writes are kept and sent again after the next"
                        " checkpoint" if sending else "")
      if sending:
        self._failing = errors.first_line(e)
      return False
    if sending and self._failing:
      logging.info("%s: delivering again", self.name)
      self._failing = None
    return True

  def _save(self) -> None:
    self._file.write(self._state)
