"""Finding a dataset's files: `data.dir`, else the cache, else a download.

Synopsis (in an experiment's loader)::

    from looper.data import datasets

    def get_config():
      c = lc.default_config()
      datasets.add_fields(c, cache_dir="~/.cache/looper/cifar10",
                          url="https://.../cifar-10-python.tar.gz",
                          file_hash="6d958be0...")  # sha256 (or md5)
      ...

    def _find(directory):      # the dataset's own reader: None if absent
      path = os.path.join(directory, "data_batch_1")
      return _read(directory) if tf.io.gfile.exists(path) else None

    arrays = datasets.locate(config.data, "CIFAR-10", _find,
                             expected="data_batch_1..5 and test_batch",
                             extract=True)

Where `locate` looks, in order, each place stopping the search:
  1. `data.dir` when set: the only place, never a download (offline runs,
     a shared disk, a bucket copied by hand);
  2. `data.cache_dir`;
  3. `keras.utils.get_file(origin=data.url, file_hash=data.file_hash)` into
     `data.cache_dir` (extracting an archive there when asked): Keras checks
     the hash, removes a partial download and, once the file is in the
     cache, never fetches it again.
Each place is searched two folder levels deep, so pointing `data.dir` at the
folder an archive was extracted into (or one above it) works. Every failure
is one ConfigError line naming the field and the fix.

Folders are searched through tf.io.gfile, so `data.dir` may be on an object
store (gs://bucket/cifar10): `find` then gets that URL, and reads it
through tf.io.gfile too. The cache is a local folder by nature (Keras
downloads and extracts on the local disk).
"""

import os
from typing import Callable, TypeVar

import keras
import ml_collections
import tensorflow as tf

from looper import errors

T = TypeVar("T")
# Folder levels below a place searched for the files: archives usually wrap
# their files in one folder (cifar-10-batches-py/, flower_photos/).
_DEPTH = 2


def add_fields(c: ml_collections.ConfigDict, *, cache_dir: str, url: str,
               file_hash: str) -> None:
  """Adds `data.cache_dir`, `data.url` and `data.file_hash` to a config.

  `data.dir` is a default field already. Set `--config.data.file_hash=''` to
  accept a mirror's file whose hash differs from the published one.
  """
  c.data.cache_dir = cache_dir
  c.data.url = url
  c.data.file_hash = file_hash


def locate(data: ml_collections.ConfigDict, dataset: str,
           find: Callable[[str], T | None], expected: str,
           extract: bool = False) -> T:
  """Returns `find(folder)` for the first folder holding the dataset's files.

  Args:
    data: the config's `data` block; reads `dir`, `cache_dir`, `url` and
      `file_hash` (see `add_fields`).
    dataset: its name in error messages ('MNIST').
    find: reads the files in a folder; returns None when they are not there,
      raises ConfigError when they are there but corrupt.
    expected: the files `find` looks for, for error messages.
    extract: the download is an archive (.tar.gz, .zip) to unpack.

  Raises:
    ConfigError: `data.dir` set but without the files; nothing in the cache
      and the download failed or does not hold the files.
  """
  if data.get("dir"):
    directory = (data.dir if "://" in data.dir  # an object store's URL
                 else os.path.abspath(os.path.expanduser(data.dir)))
    found = _search(directory, find)
    if found is None:
      missing = ("" if tf.io.gfile.isdir(directory)
                 else " (the directory does not exist)")
      raise errors.ConfigError(
          f"config.data.dir={data.dir!r} ({directory}) has no {dataset}"
          f" files{missing}: expected {expected}; point --config.data.dir at"
          f" the folder holding them")
    return found

  if "://" in data.cache_dir:
    raise errors.ConfigError(
        f"config.data.cache_dir={data.cache_dir!r} is not a local folder, and"
        " Keras downloads only to a local disk; set --config.data.cache_dir to"
        " one, or copy the files to the bucket and set --config.data.dir")
  cache = os.path.abspath(os.path.expanduser(data.cache_dir))
  found = _search(cache, find)
  if found is not None:
    return found
  local = _local_name(data.url, extract)
  try:
    # Keras falls back to /tmp/.keras for a cache folder that does not
    # exist yet (it tests os.access first): create it.
    tf.io.gfile.makedirs(cache)
    path = keras.utils.get_file(
        fname=local, origin=data.url, file_hash=data.get("file_hash") or None,
        cache_dir=cache, cache_subdir="", extract=extract)
    found = _search(path if extract else os.path.dirname(path), find)
    if found is None:
      raise ValueError(f"the download has no {expected}")
  except Exception as e:  # pylint: disable=broad-except
    # Keras raises a bare Exception for a URL failure and ValueError for a
    # bad hash, and keeps a file that failed its hash: remove it so a junk
    # page served with status 200 never becomes the cache.
    _remove(os.path.join(cache, local), os.path.join(cache, local + "_archive"))
    raise errors.ConfigError(
        f"{dataset} not found: looked in config.data.cache_dir ({cache}) for"
        f" {expected}, and the download from config.data.url={data.url!r}"
        f" failed ({errors.first_line(e)}); set --config.data.dir to a"
        f" folder with the files") from None
  return found


def _remove(*paths: str) -> None:
  for path in paths:
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    elif tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)


def _local_name(url: str, extract: bool) -> str:
  """The file name in the cache: an archive's name without its extension.

  Keras extracts `fname` (without a dot) into `cache_dir/fname`, so the
  extracted folder is named after the archive and found by `_search`.
  """
  name = os.path.basename(url.split("?")[0]) or "download"
  return name.split(".")[0] if extract else name


def _search(directory: str, find: Callable[[str], T | None]) -> T | None:
  """`find` on `directory`, then on its sub-folders down to _DEPTH levels."""
  level = [directory]
  for _ in range(_DEPTH + 1):
    next_level = []
    for folder in level:
      if not tf.io.gfile.isdir(folder):
        continue
      found = find(folder)
      if found is not None:
        return found
      # An object store lists a folder with a trailing slash.
      next_level += sorted(
          os.path.join(folder, name.rstrip("/"))
          for name in tf.io.gfile.listdir(folder)
          if tf.io.gfile.isdir(os.path.join(folder, name)))
    level = next_level
  return None
