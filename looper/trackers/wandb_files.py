"""What a W&B run's own files hold: every attempt's `.wandb` file read back.

Synopsis::

    from looper.trackers import wandb_files
    paths = wandb_files.paths(folder, run_id)   # <folder>/wandb/*run-*-<id>/
    wandb_files.wait_for_writers(paths)         # an earlier attempt's
                                                # wandb-core has let go
    rows = wandb_files.history(paths)           # [(step, {key: value})]
    wandb_files.held(rows)                      # {(key, step)}
    wandb_files.summary(paths)                  # {key: value}, the latest
    for record in wandb_files.records(path): ...  # wandb_internal_pb2.Record

Why: `run.log()` returns once W&B took the point, but its wandb-core
process writes the run's `.wandb` file later, a whole 32 KiB block at a
time (and every `x_transaction_log_flush_interval`, 15 s): a kill -9 of
the run takes wandb-core down with it and loses what it had not written.
W&B has no flush call and wandb ships no Python reader of these files
(0.31 has no `wandb.sdk.internal.datastore`, the old one; `wandb sync` is
wandb-core's, in Go), so this is one, for the version the wandb extra
pins (pyproject.toml; tests/unit/trackers/test_wandb.py).

The format (wandb-core's core/pkg/leveldb and core/internal/transactionlog,
store version 0): a 7-byte header (":W&B", magic 0xBEE1 little-endian,
version 0), then LevelDB's log: 32 KiB blocks of chunks, each a 7-byte
header (CRC-32 (IEEE) of its type byte and payload, the payload's length
(uint16), its type: 1 a whole record, 2 its first chunk, 3 a middle one,
4 its last) and the payload; a block's tail too short for a header is
zeros. A record, its chunks' payloads joined, is a protobuf
`wandb_internal_pb2.Record`. A chunk that fails its check (a torn tail)
ends its block, as LevelDB's reader recovers: the next block is read on.

Each attempt of a run writes a new folder (offline: `offline-run-<time>-
<id>`; online `run-<time>-<id>`), so a run is all of them, in time order.
"""

import json
import os
import pathlib
import re
import struct
import time
import zlib

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
CHUNK_HEADER = 7
FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def paths(folder: str, run_id: str) -> list[pathlib.Path]:
  """The `.wandb` files of the run `run_id` in W&B's folder `folder` (its
  `wandb/` holds the runs' folders), oldest attempt first."""
  pattern = re.compile(
      rf"(?:offline-)?run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}")
  found = []
  root = pathlib.Path(folder, "wandb")
  for sub in root.iterdir() if root.is_dir() else ():
    match = pattern.fullmatch(sub.name)
    path = sub / f"run-{run_id}.wandb"
    if match and not sub.is_symlink() and path.is_file():
      found.append((match.group(1), path))
  return [path for _, path in sorted(found)]


def records(path: pathlib.Path) -> list[wandb_internal_pb2.Record]:
  """The whole records of one `.wandb` file, in order (see module doc)."""
  data = pathlib.Path(path).read_bytes()
  if data[:len(FILE_HEADER)] != FILE_HEADER:
    raise ValueError(
        f"{path}: not a W&B run file of store version 0 (its header is"
        f" {data[:len(FILE_HEADER)]!r}); looper reads the files of the wandb"
        " its extra pins: pip install 'looper[wandb]'")
  out, parts, pos = [], None, len(FILE_HEADER)
  while pos + CHUNK_HEADER <= len(data):
    block_end = min(pos - pos % BLOCK + BLOCK, len(data))
    if block_end - pos < CHUNK_HEADER:
      pos = block_end
      continue
    checksum, length, kind = struct.unpack_from("<IHB", data, pos)
    end = pos + CHUNK_HEADER + length
    payload = data[pos + CHUNK_HEADER:end]
    if (end > block_end or kind not in (FULL, FIRST, MIDDLE, LAST) or
        checksum != zlib.crc32(bytes([kind]) + payload)):
      # Zeros (a block's padding) or a torn chunk: the block ends here.
      pos, parts = block_end, None
      continue
    pos = end
    if kind in (FULL, FIRST):
      parts = [payload]
    elif parts is not None:  # a middle or last chunk of a record begun
      parts.append(payload)
    if kind in (FULL, LAST) and parts is not None:
      record = wandb_internal_pb2.Record()
      record.ParseFromString(b"".join(parts))
      out.append(record)
      parts = None
  return out


def values(items) -> dict:
  """A record's items (history's, summary's, config's) as {key: value}: a
  nested key joined with '/' (W&B's media: `samples/_type`, ...)."""
  return {item.key or "/".join(item.nested_key): json.loads(item.value_json)
          for item in items}


def history(files: list[pathlib.Path]) -> list[tuple[int, dict]]:
  """Every history row the files hold, in order: (step, {key: value})."""
  rows = []
  for path in files:
    for record in records(path):
      if record.WhichOneof("record_type") == "history":
        row = values(record.history.item)
        rows.append((int(row.get("_step", record.history.step.num)), row))
  return rows


def held(rows: list[tuple[int, dict]]) -> set[tuple[str, int]]:
  """(key, step) of every value in `rows` (W&B's own `_step`, `_runtime`,
  `_timestamp` left out), a medium's (`samples/_type`) as its own key
  (`samples`)."""
  return {(key.removesuffix("/_type"), step) for step, row in rows
          for key in row if not key.startswith("_")}


def summary(files: list[pathlib.Path]) -> dict:
  """The run's summary as the files leave it: each key's latest value."""
  out = {}
  for path in files:
    for record in records(path):
      if record.WhichOneof("record_type") == "summary":
        out.update(values(record.summary.update))
        for item in record.summary.remove:
          out.pop(item.key or "/".join(item.nested_key), None)
  return out


def writers(files: list[pathlib.Path]) -> list[int]:
  """The processes that have one of `files` open (Linux' /proc; elsewhere
  none are known): an earlier attempt's wandb-core, still writing."""
  targets = {os.path.realpath(path) for path in files}
  found = []
  for pid in os.listdir("/proc") if targets and os.path.isdir("/proc") else ():
    if not pid.isdigit():
      continue
    try:
      links = [os.readlink(f"/proc/{pid}/fd/{fd}")
               for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:  # gone, or not ours to look into
      continue
    if targets.intersection(links):
      found.append(int(pid))
  return found


def wait_for_writers(files: list[pathlib.Path], timeout: float = 60) -> None:
  """Returns once no process has one of `files` open (what they hold is
  then final); raises if one still does after `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while pids := writers(files):
    if time.monotonic() >= deadline:
      raise RuntimeError(
          f"process {pids[0]} (an earlier attempt's wandb-core) still writes"
          f" the run's files after {timeout:.0f} s; wait for it to end, or"
          f" end it (kill {pids[0]}), and rerun")
    time.sleep(0.1)
