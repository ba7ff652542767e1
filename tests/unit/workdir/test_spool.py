"""looper.workdir.spool: a tracker's images, histograms and texts kept in the
workdir, read back exactly as written (raw arrays, bucket counts, texts),
on a local disk and on TensorFlow's ram:// (an object store), then removed.
The kill tests (tests/unit/trackers/test_wandb.py, test_mlflow.py) show a
rerun sending them."""

import uuid

import numpy as np
import pytest

from looper import workdir
from looper.workdir import spool


@pytest.mark.parametrize("where", ["local", "ram"])
def test_writes_read_back_as_written_then_removed(tmp_path, where):
  root = (str(tmp_path) if where == "local" else
          f"ram://looper-spool-{uuid.uuid4().hex[:8]}")
  wd = workdir.Workdir(root)
  kept = spool.Spool(wd.tracker_media("wandb"), wd.checkpoints)
  assert kept.read() == []  # no folder yet
  pixels = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
  values = np.array([0.25, -1.5, 1e-30, 7.0])
  paths = [kept.put(20, "images", {"a/samples": pixels}, time=2.5),
           kept.put(10, "histograms", {"logits": values, "w": values[:2]},
                    {"logits": 4}, time=1.5),
           kept.put(10, "texts", {"note": "step 10 ✓"}, time=1.0)]
  got = kept.read()
  assert [(e.step, e.kind, e.time, e.path) for e in got] == [
      (10, "texts", 1.0, paths[2]), (10, "histograms", 1.5, paths[1]),
      (20, "images", 2.5, paths[0])]
  assert got[0].values == {"note": "step 10 ✓"} and got[0].buckets is None
  assert list(got[1].values) == ["logits", "w"]
  assert got[1].values["logits"].tobytes() == values.tobytes()
  assert got[1].values["w"].tobytes() == values[:2].tobytes()
  assert got[1].buckets == {"logits": 4}
  image = got[2].values["a/samples"]
  assert image.dtype == np.uint8 and np.array_equal(image, pixels)
  kept.remove(paths[1], paths[1])  # removed twice: no matter
  assert [e.path for e in kept.read()] == [paths[2], paths[0]]
