"""A tracker's images, histograms and texts, kept in the workdir until the tracker holds them.

Synopsis::

    from looper.workdir import spool
    kept = spool.Spool(wd.tracker_media("wandb"), wd.checkpoints)
    path = kept.put(10, "images", {"samples": pixels}, time=t)
    kept.put(10, "histograms", {"logits": values}, {"logits": 4}, time=t)
    for entry in kept.read(): ...   # spool.Entry(step, kind, values,
                                    # buckets, time, path), by step
    kept.remove(path, ...)          # the tracker holds them

Why: scalars are in metrics.jsonl, so a restart after a kill -9 sends a
tracker those it had not received; an image, a histogram or a text is
nowhere else (TensorBoard's events hold a histogram's buckets, not its
values). So each one a tracker is given is kept here, raw, until the
tracker is known to hold it (looper.trackers.delivery says when): a
restart sends it again exactly as first given (a histogram rebuilt from
its values with its bucket count).

A file per write (of one kind, at one step), `<step>-<kind>-<id>.npz`:
NumPy arrays `names` (the values' names), `v<i>` (the i-th value: an
image's pixels, a histogram's values, a text as a 0-d string array),
`b<i>` (its bucket count; 0: none given) and `time` (seconds since the
epoch). It is written whole (`files.write_text`: a temporary renamed over
it), so a kill leaves the file or none; read without pickle.
"""

import dataclasses
import io
import os
import re
import uuid

import numpy as np
import tensorflow as tf

from looper.workdir import files

NAME = re.compile(r"(\d+)-(\w+)-[0-9a-f]+\.npz")


@dataclasses.dataclass
class Entry:
  """One write kept: what a tracker was given at `step`, of `kind`."""
  step: int
  kind: str  # images | histograms | texts
  values: dict
  buckets: dict[str, int] | None
  time: float
  path: str


@dataclasses.dataclass(frozen=True)
class Spool:
  """The folder `folder` of one tracker's kept writes.

  Args:
    folder: where (`Workdir.tracker_media`).
    checkpoints: the run's `Workdir.checkpoints`: a full disk's line names
      the newest checkpoint there as kept.
  """
  folder: str
  checkpoints: str

  def put(self, step: int, kind: str, values: dict,
          buckets: dict[str, int] | None = None, *, time: float) -> str:
    """Keeps one write; its file's path (for `remove`)."""
    names = list(values)
    arrays = {"names": np.array(names, dtype=str),
              "time": np.array(time, dtype=np.float64)}
    for i, name in enumerate(names):
      value = values[name]
      arrays[f"v{i}"] = (np.array(str(value)) if kind == "texts" else
                         np.asarray(value))
      arrays[f"b{i}"] = np.array((buckets or {}).get(name) or 0)
    data = io.BytesIO()
    np.savez(data, **arrays)
    path = os.path.join(self.folder,
                        f"{int(step)}-{kind}-{uuid.uuid4().hex[:12]}.npz")
    with files.on_full_disk(self.folder, os.path.basename(path),
                            self.checkpoints):
      files.makedirs(self.folder)
      files.write_text(path, data.getvalue())
    return path

  def read(self) -> list[Entry]:
    """Every write kept, by step (then time)."""
    out = []
    for path in tf.io.gfile.glob(os.path.join(self.folder, "*.npz")):
      match = NAME.fullmatch(os.path.basename(path))
      if not match:
        continue
      with tf.io.gfile.GFile(path, "rb") as f:
        data = np.load(io.BytesIO(f.read()), allow_pickle=False)
      kind = match.group(2)
      values, buckets = {}, {}
      for i, name in enumerate(data["names"].tolist()):
        value = data[f"v{i}"]
        values[name] = str(value) if kind == "texts" else value
        if int(data[f"b{i}"]):
          buckets[name] = int(data[f"b{i}"])
      out.append(Entry(int(match.group(1)), kind, values, buckets or None,
                       float(data["time"]), path))
    return sorted(out, key=lambda e: (e.step, e.time))

  def remove(self, *paths: str) -> None:
    """Drops the writes kept at `paths` (held by the tracker, or to be
    written again); one already gone is no matter."""
    for path in paths:
      try:
        files.remove(path)
      except tf.errors.NotFoundError:
        pass
