"""Text as bytes: a folder of text files (or TinyShakespeare), split, windowed.

Synopsis::

    from experiments.text import data
    stream = data.corpus(config.data, "eval")      # bytes, files NUL-joined
    inputs, labels, weights = data.windows(stream, context=64, stride=64,
                                           pad=True)
    inputs, labels = data.windows(stream, context=64, stride=1, pad=False)
    np.asarray(inputs[:2])                         # int32 [2, 64]

The tokens are the bytes: 256 ids, no tokenizer.

The corpus, when `data.dir` is set (never a download there): the files
ending in .txt, .text, .rst, .md or .markdown below it, but hidden files
and folders and LICENSE*/LICENCE*/COPYING* (for pydocs: exactly the 71
files of the docs). `data.eval_glob` (relative to data.dir; a folder stands
for every text file below it) picks the eval files, every other one is
train: whole files apart. `data.eval_glob=''` holds out the last
`data.eval_fraction` of the bytes instead, which is also how TinyShakespeare
(no data.dir: found in `data.cache_dir` or downloaded, as
`looper.data.datasets.locate` does) is split, as nanoGPT does. A split is its
files in sorted order, joined with one NUL byte (which UTF-8 text never
holds: GPT-2's <|endoftext|>).

Windows of a split's bytes b (n of them), context T, stride S: inputs
b[s:s+T] and labels b[s+1:s+T+1] for s = 0, S, 2S, ...; only full windows,
or with `pad=True` (and S = T) every byte but the first a label exactly
once, the last window padded with weight 0. They are virtual
(`looper.data.windows.Windows`): the bytes are held once, as uint8, and
inputs and labels are two views of them that array mode gathers a batch
at a time, so no window is ever stored and stride 1 (every offset) costs
the bytes alone.
"""

import glob
import os

import ml_collections
import numpy as np

from looper import config as lc
from looper.data import datasets
from looper.data import windows as windows_lib

# The split names a corpus has.
SPLITS = ("train", "eval")
DEFAULT_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
               "data/tinyshakespeare/input.txt")
# TensorFlow Datasets' recorded sha256 of that file (1,115,394 bytes,
# tensorflow_datasets/datasets/tiny_shakespeare/checksums.tsv).
DEFAULT_HASH = (
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")
DEFAULT_CACHE_DIR = "~/.cache/looper/tinyshakespeare"
SHAKESPEARE_FILE = "input.txt"
# What a file's name ends with for it to be read as text (see module doc).
TEXT_SUFFIXES = (".txt", ".text", ".rst", ".md", ".markdown")
# Files of a corpus that are not its text (matched on the upper-case name).
NOT_TEXT_PREFIXES = ("LICENSE", "LICENCE", "COPYING")
# Between two files of a split; also the right padding of eval windows and
# prompts (weight 0, or after the causal mask's horizon).
SEPARATOR = b"\0"
VOCAB = 256  # bytes


def text_files(directory: str) -> list[str]:
  """The text files below `directory` (see the module doc), as sorted
  paths relative to it with '/' separators."""
  found = []
  for folder, subfolders, names in os.walk(directory):
    subfolders[:] = [d for d in subfolders if not d.startswith(".")]
    for name in names:
      if (name.lower().endswith(TEXT_SUFFIXES) and not name.startswith(".")
          and not name.upper().startswith(NOT_TEXT_PREFIXES)):
        path = os.path.relpath(os.path.join(folder, name), directory)
        found.append(path.replace(os.sep, "/"))
  return sorted(found)


def _eval_files(directory: str, pattern: str, files: list[str]) -> set[str]:
  """The text `files` the glob `pattern` selects (a matched folder: every
  text file below it)."""
  chosen = set()
  for match in glob.glob(pattern, root_dir=directory, recursive=True):
    match = os.path.normpath(match).replace(os.sep, "/")
    if os.path.isdir(os.path.join(directory, match)):
      prefix = "" if match == "." else match + "/"
      chosen.update(f for f in files if f.startswith(prefix))
    elif match in files:
      chosen.add(match)
  return chosen


def _read(directory: str, files: list[str]) -> bytes:
  parts = []
  for name in files:
    with open(os.path.join(directory, name), "rb") as f:
      data = f.read()
    if SEPARATOR in data:
      raise lc.ConfigError(
          f"config.data.dir: {os.path.join(directory, name)} holds NUL bytes,"
          " so it is not UTF-8 text (UTF-16 or binary); convert it to UTF-8"
          " or move it out of --config.data.dir")
    parts.append(data)
  return SEPARATOR.join(parts)


def _by_fraction(data: ml_collections.ConfigDict, stream: bytes,
                 name: str) -> bytes:
  """nanoGPT's split: the first 1 - eval_fraction of the bytes train."""
  fraction = data.eval_fraction
  if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
    raise lc.ConfigError(
        f"config.data.eval_fraction={fraction!r} must be in (0, 1), e.g. 0.1;"
        " set --config.data.eval_fraction")
  cut = int(len(stream) * (1 - fraction))
  return stream[:cut] if name == "train" else stream[cut:]


def _shakespeare(directory: str) -> bytes | None:
  path = os.path.join(directory, SHAKESPEARE_FILE)
  if not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    return f.read()


def corpus(data: ml_collections.ConfigDict, name: str) -> bytes:
  """Split `name`'s byte stream ('train' or 'eval', no slice): its files
  joined by SEPARATOR, or its share of the bytes (see the module doc).

  Args:
    data: the config's `data` block: `dir`, `eval_glob`, `eval_fraction`
      and `datasets.add_fields`' `cache_dir`, `url`, `file_hash`.
    name: 'train' or 'eval'.

  Raises:
    ConfigError: no text files under data.dir, an eval_glob selecting no
      file or every file, a NUL byte in a file, a failed download.
  """
  if name not in SPLITS:
    raise lc.ConfigError(
        f"the text corpus has no split {name!r}; use"
        f" {' or '.join(repr(s) for s in SPLITS)} in --config.data.train_split"
        " / --config.data.eval_split")
  if not data.get("dir"):
    stream = datasets.locate(data, "TinyShakespeare", _shakespeare,
                             expected=SHAKESPEARE_FILE)
    return _by_fraction(data, stream, name)

  directory = os.path.abspath(os.path.expanduser(data.dir))
  # data.dir itself only: text_files reads every folder below it but the
  # hidden ones, the only ones locate's search of sub-folders could add.
  files = datasets.locate(
      data, "text",
      lambda folder: (text_files(folder) or None) if folder == directory
      else None,
      expected=f"*{', *'.join(TEXT_SUFFIXES)} files")
  pattern = data.eval_glob
  if not pattern:
    return _by_fraction(data, _read(directory, files), name)
  if os.path.isabs(pattern):
    raise lc.ConfigError(
        f"config.data.eval_glob={pattern!r} must be relative to data.dir,"
        " e.g. 'faq/*'; set --config.data.eval_glob")
  held_out = _eval_files(directory, pattern, files)
  if not held_out or len(held_out) == len(files):
    what = "no" if not held_out else f"all {len(files)}"
    raise lc.ConfigError(
        f"config.data.eval_glob={pattern!r} selects {what} of the text files"
        f" under data.dir ({directory}); set --config.data.eval_glob to the"
        " eval files' glob, e.g. 'faq/*' ('': the last data.eval_fraction"
        " of the bytes)")
  chosen = sorted(held_out) if name == "eval" else [
      f for f in files if f not in held_out]
  return _read(directory, chosen)


def windows(stream: bytes, *, context: int, stride: int, pad: bool
            ) -> tuple[windows_lib.Windows, ...]:
  """The windows of `stream` (module doc), virtual, over its bytes held
  once as uint8: (inputs, labels), int32 [N, context] bytes and next
  bytes, and with `pad` the weights, float32 [N, context] 1.0 for a real
  label, 0.0 for padding (without, every label is real: no weights). `pad`
  needs a stream of at least 2 bytes, else at least context + 1."""
  b = np.frombuffer(stream, np.uint8)  # the bytes object's own memory
  if pad:
    # The last window padded with zeros: every byte but the first is a
    # label of exactly one window (S = T); a label at k is real if k < n.
    count = -(-(len(b) - 1) // stride)
    b = np.concatenate([b, np.zeros((count - 1) * stride + context + 1 -
                                    len(b), np.uint8)])
    real = (np.arange(len(b)) < len(stream)).astype(np.uint8)
  else:
    count = (len(b) - context - 1) // stride + 1
  # The labels of a window are its inputs shifted by one byte.
  rows = lambda source, start, dtype: windows_lib.Windows(
      source, context, stride=stride, start=start, count=count, dtype=dtype)
  both = (rows(b, 0, np.int32), rows(b, 1, np.int32))
  return (*both, rows(real, 1, np.float32)) if pad else both
