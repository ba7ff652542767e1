"""The command line's flags and errors: one parser style (absl), one-line errors.

Synopsis::

    app.run(main, flags_parser=parsing.parse_flags)   # looper.main
    args = parsing.parse_tool_flags(argv, FLAGS, usage)  # looper launch,
                                                              # looper runs

`--config.train.stpes=5` makes ml_collections raise a multi-line KeyError;
a config file whose own code fails raises inside absl's parser. Both reach
the user here: a typo as one line with "did you mean", a bug in the file
with the traceback from the file's first frame (absl's frames above it
would only hide the user's line). A --config path that is no file, a file
that does not compile, one without get_config() and a get_config() that
returns None are one line each: no frame of theirs would help.
"""

import os
import re
import sys
import traceback
import types
from typing import Sequence

from absl import flags

from looper.errors import ConfigError


def override_error(exc: BaseException, argv) -> str:
  """Turns ml_collections' multi-line 'no such field' error into one line.

  Args:
    exc: what parsing a `--config.x.y=v` flag raised.
    argv: the command line, to name the flag that caused it.
  """
  text, bad, flag = _override_flag(exc, argv)
  flag = flag or f"--config...{bad}"
  suggestion = re.search(r'Did you mean "([\w.]+)"', text)
  head, _, tail = flag.rpartition(bad)
  hint = (f"did you mean {head}{suggestion.group(1)}{tail}?"
          if suggestion else "run with --helpfull to list the config fields")
  return f"{flag}: the config has no field {bad!r}; {hint}"


def _override_flag(exc: BaseException, argv):
  """(exc's text, the key it names, the --config.* flag with that key)."""
  text = str(exc).replace("\\n", "\n").replace("\\'", "'")
  key = re.search(r"""^['"]*(?:Key ")?([\w.]+)""", text)
  bad = key.group(1) if key else "?"
  flag = next((a.split("=")[0] for a in argv[1:]
               if a.startswith("--config.") and
               re.search(rf"\.{re.escape(bad)}(\.|=|$)", a.split("=")[0])),
              None)
  return text, bad, flag


def parse_error(exc: BaseException, argv
                ) -> tuple[str, types.TracebackType | None]:
  """Explains an error (not absl's own) raised while the flags were parsed.

  A KeyError/AttributeError is one of two different errors. ml_collections
  raises one for a --config.* override that names no field: a typo, for
  which one line is best. The --config file's own code raises one too, e.g.
  os.environ['X'] in get_config(): a bug in the file, for which the
  traceback is what helps, as for any other error of the file (a NameError
  at import). It is an override error only if no frame of the traceback
  runs the config file and the key it names is in a --config.* flag. A file
  without get_config() fails in config_flags' frame: one line, too. So
  does looper's own ConfigError raised by the file's code, with the line.

  Args:
    exc: what `flags.FLAGS(argv)` raised.
    argv: the command line.

  Returns:
    (the one line to end with, the traceback to print before it or None).
  """
  path = _config_file_arg(argv)
  in_file = exc.__traceback__
  while in_file is not None and (
      path is None or os.path.realpath(in_file.tb_frame.f_code.co_filename)
      != os.path.realpath(path)):
    in_file = in_file.tb_next
  if in_file is None and _override_flag(exc, argv)[2]:
    return override_error(exc, argv), None
  # config_flags calls module.get_config(): the file itself lacks it.
  if (in_file is None and isinstance(exc, AttributeError) and
      exc.name == "get_config" and path is not None and
      os.path.realpath(getattr(exc.obj, "__file__", None) or "") ==
      os.path.realpath(path)):
    return (f"--config={path}: the file defines no get_config(); define"
            " get_config() returning the experiment's config, as"
            " experiments/mnist.py does"), None
  if isinstance(exc, ConfigError) and in_file is not None:
    # looper's own line (a looper.Action without a trigger): the file's
    # line that made it is all the traceback would add.
    while in_file.tb_next is not None and os.path.realpath(
        in_file.tb_next.tb_frame.f_code.co_filename) == os.path.realpath(path):
      in_file = in_file.tb_next
    return f"--config={path}, line {in_file.tb_lineno}: {exc}", None
  # Printed from the config file's first frame on: absl's and
  # ml_collections' frames above it would only hide the user's line.
  return (f"--config={path}: loading the config file raised {exc!r}; see the"
          " traceback above", in_file or exc.__traceback__)


def syntax_error(exc: SyntaxError, argv) -> str:
  """One line for a config file, or a module it imports, that does not
  compile: the file, the line and its code, where Python's own report is
  a page of import frames."""
  path = _config_file_arg(argv)
  line = f"line {exc.lineno}"
  fix = "fix the config file"
  if exc.filename and os.path.realpath(exc.filename) != os.path.realpath(
      path or ""):
    line = f"line {exc.lineno} of {exc.filename}, which it imports"
    fix = "fix that file"
  code = (exc.text or "").strip()
  code = f" ({code})" if code else ""
  return f"--config={path}: {exc.msg} at {line}{code}; {fix}"


def _config_file_arg(argv) -> str | None:
  """The path in --config=PATH[:ARG] (or --config PATH), if given."""
  for i, arg in enumerate(argv[1:], 1):
    if arg == "--":
      break
    match = re.match(r"^--?config(?:=(.*))?$", arg)
    if match:
      value = match.group(1) if "=" in arg else (
          argv[i + 1] if i + 1 < len(argv) else None)
      # config_flags passes what follows the first ':' to get_config().
      return value.split(":", 1)[0] if value else None
  return None


def parse_flags(argv):
  """absl's parser (`app.run(..., flags_parser=)`), config errors in one line."""
  path = _config_file_arg(argv)
  # config_flags would defer this error to the config's first use, then
  # raise it as a page listing the paths it tried.
  if path is not None and not os.path.isfile(path):
    sys.exit(f"looper: --config={path}: no such file; give the path of an"
             " experiment file, e.g. --config=experiments/mnist.py")
  try:
    # The config file runs here: a Keras metric object it makes must not
    # create TensorFlow variables before looper sets the devices up.
    # (Imported here: `looper launch` shares this module and starts no
    # TensorFlow.)
    from looper import keras_compat  # pylint: disable=g-import-not-at-top
    with keras_compat.keras_variables_deferred():
      return flags.FLAGS(argv)
  except ConfigError as e:
    sys.exit(f"looper: {e}")
  except SyntaxError as e:  # the config file, or a module it imports
    sys.exit(f"looper: {syntax_error(e, argv)}")
  except flags.Error as e:
    # ml_collections re-raises a TypeError/ValueError of the config file
    # (e.g. `c.train.steps = "100"`) as text; the original is its context.
    wrapper = e.__context__
    if (wrapper is not None and wrapper.__context__ is not None and
        str(wrapper).startswith("Error whilst parsing config file")):
      _exit_with(wrapper.__context__, argv)
    # absl's required-flag check, failing on what get_config() returned.
    if path is not None and str(e).startswith("flag --config=None: "):
      sys.exit(f"looper: --config={path}: get_config() returned None; end it"
               " with `return` and the config")
    sys.exit(f"looper: {e}")
  # An override (KeyError, AttributeError), or the config file's own code
  # (NameError, ImportError, ... at import or in get_config()).
  except Exception as e:  # pylint: disable=broad-exception-caught
    _exit_with(e, argv)


def _exit_with(e: BaseException, argv):
  line, trace = parse_error(e, argv)
  if trace is not None:  # the config file's own bug: show where
    traceback.print_exception(type(e), e, trace)
  sys.exit(f"looper: {line}")


def parse_tool_flags(argv: Sequence[str] | None,
                     flag_values: flags.FlagValues, usage: str,
                     missing_args: str | None) -> list[str]:
  """Parses a tool's own flags (`looper launch`, `looper runs`) with absl.

  Each tool keeps its flags in its own `FlagValues`, apart from looper.main's
  (which marks --config required). Args after `--` are returned untouched.

  Args:
    argv: the tool's arguments (without the program name); None:
      sys.argv's.
    flag_values: the tool's flags.
    usage: the usage line, printed with --help and above a bad flag's line.
    missing_args: the error when no argument is given; None: the tool
      takes none (`looper data_service`) and its caller refuses any.

  Returns:
    The positional arguments, then those after `--`.
  """
  argv = sys.argv[1:] if argv is None else list(argv)
  own = argv[:argv.index("--")] if "--" in argv else argv
  if "--help" in own or "-h" in own:
    print(f"{usage}\n{flag_values.get_help(include_special_flags=False)}")
    sys.exit(0)
  # A second call in one process (tests, a notebook) starts from the
  # defaults again: absl keeps the values of the last parse.
  flag_values.unparse_flags()
  try:
    args = flag_values(["looper", *argv])[1:]
  except flags.Error as e:
    sys.exit(f"{usage}\nlooper: {e}")
  if not args and missing_args is not None:
    sys.exit(f"{usage}\nlooper: {missing_args}")
  return args
