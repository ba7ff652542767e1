"""Names of objects in a config: `module:name` strings, loading, JSON.

Synopsis::

    from looper import references
    model_fn = references.resolve(config.model_fn, "model_fn")  # fn or 'mod:fn'
    references.resolve("experiments/mnist.py:model_fn", "model_fn")  # by path
    read = references.bound(config, "dataset_fn")  # read(split): of config
    text = references.to_json(config)     # callables written as 'module:name'

A config field may hold a callable, a class or a string naming one
('experiments.mnist:model_fn', 'experiments/mnist.py:model_fn'). `to_json`
writes the resolved config with every callable as such a string when one
reaches it, so the saved config.json loads back; what no name reaches (a
lambda, a partial, a callable instance) is written as an `<unloadable: ...>`
description that `resolve` rejects in one line. This module knows nothing
of what the fields mean.
"""

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import numbers
import os
import re
import sys
import types
from typing import Any

import ml_collections

from looper.errors import ConfigError

# How `to_json` marks a callable that no 'module:name' string can load back.
UNLOADABLE = "<unloadable: "


def resolve(value: Any, field: str) -> Any:
  """Returns the object a config field names: itself, or 'module:attr' loaded.

  Args:
    value: a callable/class, or a 'module:attribute' string.
    field: the config field, for the error message (e.g. 'model_fn').

  Raises:
    ConfigError: the value is missing, malformed or cannot be imported.
  """
  if value is None:
    raise ConfigError(
        f"config.{field} is not set; assign a function in get_config() or a"
        f" 'module:function' string")
  if not isinstance(value, str):
    return value
  if value.startswith(UNLOADABLE):
    raise ConfigError(
        f"config.{field}={value!r} was saved from an object that cannot be"
        f" loaded back; set config.{field} in get_config() to a module-level"
        " function or a 'module:name' string")
  module_name, sep, attr = value.rpartition(":")
  if not sep or not module_name or not attr:
    raise ConfigError(
        f"config.{field}={value!r} is not 'module:name'; write it like"
        f" 'experiments.mnist:model_fn' or 'experiments/mnist.py:model_fn'")
  try:
    obj = _import(module_name)
  except (ImportError, FileNotFoundError) as e:
    raise ConfigError(
        f"config.{field}={value!r}: cannot import module {module_name!r}"
        f" ({e}); make it importable from the working directory or"
        f" PYTHONPATH") from None
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise ConfigError(
          f"config.{field}={value!r}: {module_name!r} has no attribute"
          f" {attr!r}; check the name after ':'")
    obj = getattr(obj, part)
  return obj


# Files loaded by `_import`, by real path.
_FILES: dict[str, types.ModuleType] = {}


def bound(c: ml_collections.ConfigDict, field: str) -> Any:
  """The callable `c[field]` names (`resolve`), given `c` as its first
  argument: an experiment's hook that takes the whole config
  (`dataset_fn(config, split)`), for a piece that gets its own block."""
  return functools.partial(resolve(c[field], field), c)


def _import(module: str):
  """Imports a module by dotted name, or a config file by its .py path.

  A file runs at most once per process, like an imported module: its top
  level may load data or have side effects, and every field naming it must
  get the same objects. A file Python already loaded (imported as a module,
  or by config_flags as the --config file) is reused, not run again.
  """
  if not module.endswith(".py"):
    return importlib.import_module(module)
  path = os.path.realpath(module)
  if path not in _FILES:
    loaded = _loaded_from(path)
    if loaded is None:
      spec = importlib.util.spec_from_file_location(
          os.path.splitext(os.path.basename(module))[0], module)
      loaded = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(loaded)  # cached only if it ran to the end
    _FILES[path] = loaded
  return _FILES[path]


def _loaded_from(path: str) -> types.ModuleType | None:
  """A module in sys.modules that was loaded from the file at `path`."""
  for module in list(sys.modules.values()):
    # vars(), not getattr: a lazy module (TensorFlow's) would import itself
    # on a missing attribute.
    file = vars(module).get("__file__") if isinstance(
        module, types.ModuleType) else None
    # Names first: realpath touches the disk, and TensorFlow brings
    # thousands of modules.
    if (isinstance(file, str) and
        os.path.basename(file) == os.path.basename(path) and
        os.path.realpath(file) == path):
      return module
  return None


def _jsonable(value: Any, marked: bool) -> Any:
  if isinstance(value, dict):
    return {k: _jsonable(v, marked) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v, marked) for v in value]
  if callable(value) and (name := _loadable_name(value)):
    return name
  if isinstance(value, numbers.Number) and not isinstance(
      value, (int, float, bool)):  # NumPy's
    return value.item() if hasattr(value, "item") else float(value)
  if value is None or isinstance(value, (str, int, float, bool)):
    return value
  # Any other callable or object (a Keras loss or callback): what it is
  # and how it was made.
  return f"{UNLOADABLE}{_describe(value)}>" if marked else _describe(value)


def _loadable_name(value: Any) -> str | None:
  """The 'module:name' string `resolve` turns back into `value`, if any."""
  module_name = getattr(value, "__module__", None)
  qualname = getattr(value, "__qualname__", None)  # None on instances
  if not (isinstance(module_name, str) and isinstance(qualname, str)):
    return None
  # '<lambda>', 'f.<locals>.g': no attribute path reaches them.
  if "<" in qualname:
    return None
  module = sys.modules.get(module_name)
  top_level = module_name.split(".")[0]
  importable = (top_level in sys.builtin_module_names or
                importlib.machinery.PathFinder.find_spec(top_level) is not None)
  if importable and _attribute(module, qualname) is value:
    return f"{module_name}:{qualname}"
  # Defined in a file loaded by path: by config_flags (under a private module
  # name that no other process can import) or by `resolve`. Name the file.
  for module in [module, *_FILES.values()]:
    file = vars(module).get("__file__") if module is not None else None
    if isinstance(file, str) and _attribute(module, qualname) is value:
      return f"{os.path.relpath(file)}:{qualname}"
  return None  # e.g. a bound method, or a name rebound since


def _attribute(obj: Any, dotted: str) -> Any:
  for part in dotted.split("."):
    obj = getattr(obj, part, None)
  return obj


def _describe(value: Any) -> str:
  """A stable description of a callable for a reader; no memory addresses."""
  if isinstance(value, functools.partial):
    args = [_describe_arg(a) for a in value.args]
    args += [f"{k}={_describe_arg(v)}" for k, v in value.keywords.items()]
    return f"functools.partial({', '.join([_describe_arg(value.func)] + args)})"
  qualname = getattr(value, "__qualname__", None)
  if isinstance(qualname, str):
    kind = ("class" if inspect.isclass(value) else
            "method" if inspect.ismethod(value) else "function")
    return f"{kind} {getattr(value, '__module__', '?')}:{qualname}"
  cls = type(value)
  settings = _settings(value)
  if settings:  # a Keras loss, metric or callback: how it was made
    args = ", ".join(f"{k}={_describe_arg(v)}" for k, v in settings.items())
    return f"{cls.__module__}:{cls.__qualname__}({args})"
  return f"instance of {cls.__module__}:{cls.__qualname__}"


def _settings(value: Any) -> dict | None:
  """How `value` was made: its get_config() (Keras' losses and metrics),
  else the arguments of its constructor it keeps under their names (a
  Keras callback's: EarlyStopping's monitor, patience, ...)."""
  get_config = getattr(value, "get_config", None)
  if callable(get_config):
    settings = get_config()
    return settings if isinstance(settings, dict) else None
  try:
    names = inspect.signature(type(value)).parameters
  except (TypeError, ValueError):  # a builtin's
    return None
  kept = vars(value) if hasattr(value, "__dict__") else {}
  return {n: kept[n] for n in names if n in kept} or None


def _describe_arg(value: Any) -> str:
  if callable(value):
    return _loadable_name(value) or _describe(value)
  return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def to_json(c: ml_collections.ConfigDict, *, marked: bool = True) -> str:
  """The resolved config as JSON, with callables written as strings.

  A callable that `resolve` can load back (a module-level function or class)
  becomes 'module:name', or 'path/to/file.py:name' for one defined in a config
  file loaded by path. Any other callable (a lambda, a nested function, a
  functools.partial, a bound method, a callable instance such as
  `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`) becomes
  '<unloadable: DESCRIPTION>', where DESCRIPTION is for a reader, e.g.
  '<unloadable: functools.partial(mod:fn, from_logits=True)>' or
  '<unloadable: instance of mod:Class>' (a Keras object: its class and
  get_config(), '<unloadable: keras.src.losses.losses:SparseCategorical
  Crossentropy(name=..., from_logits=True, ...)>'). Any other object JSON
  cannot hold (a Keras callback in config.callbacks) is described alike:
  '<unloadable: keras.src.callbacks.early_stopping:EarlyStopping(monitor=
  'val_accuracy', patience=3, ...)>'. `resolve` rejects such a string with
  a one-line error. Saving never fails on a value a config holds.
  `marked=False` (for a reader, `looper describe`): each such value is its
  DESCRIPTION alone, its class and how it was made; only a config.json
  read back needs the marker.
  """
  return json.dumps(_jsonable(c.to_dict(), marked), indent=2,
                    sort_keys=True)
