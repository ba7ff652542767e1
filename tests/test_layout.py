"""The tree: imports flow one way between the groups BUILD.md's Layout names.

Read from the source (ast), not by importing: a module imports looper's
modules only from its own group or the groups before it in `GROUPS`.
"""

import ast
import pathlib

from tests.conftest import ROOT

# In import order: each may import those before it (and its own group).
GROUPS = (
    ("looper.errors", "looper.references", "looper.compat", "looper.autograph",
     "looper.data.splits", "looper.fields", "looper.network"),
    ("looper.options",),
    ("looper.config",),
    ("looper.data",),
    ("looper.workdir",),
    ("looper.train",),
    ("looper.run", "looper.console"),
    ("looper.main", "looper.cli"),
)


def _module(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _group(module: str) -> int:
  """The index of the most specific GROUPS prefix naming `module`."""
  found = max(((len(name), i) for i, group in enumerate(GROUPS)
               for name in group
               if module == name or module.startswith(name + ".")),
              default=None)
  assert found, f"{module} is in no group of tests/test_layout.py"
  return found[1]


def _imports(path: pathlib.Path):
  modules = {_module(p) for p in (ROOT / "looper").rglob("*.py")}
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
        "looper"):
      for alias in node.names:  # `from looper.x import module` or a name
        name = f"{node.module}.{alias.name}"
        yield name if name in modules else node.module
    elif isinstance(node, ast.Import):
      yield from (a.name for a in node.names if a.name.startswith("looper"))


def test_imports_flow_one_way():
  upward = []
  for path in sorted((ROOT / "looper").rglob("*.py")):
    importer = _module(path)
    for imported in _imports(path):
      if imported != "looper" and _group(imported) > _group(importer):
        upward.append(f"{importer} imports {imported}")
  assert not upward


def test_every_module_is_one_concept_of_at_most_400_lines():
  long = {_module(p): n for p in (ROOT / "looper").rglob("*.py")
          if (n := len(p.read_text().splitlines())) > 400}
  assert not long
  for path in (ROOT / "looper").rglob("*.py"):
    assert ast.get_docstring(ast.parse(path.read_text())), path


# Modules outside looper/workdir/ that write files, each a file of no run.
NOT_RUN_FILES = {
    "looper.data.shards": "the shard writer (`python -m looper.cli.shards"
                          " write`): a dataset's shards in a folder the user"
                          " names, read by runs",
    "looper.data.datasets": "the download cache (config.data.cache_dir):"
                            " the folder Keras downloads into; a failed"
                            " download removed",
    "looper.train.peak_flops": "the cache of this machine's measured peak FLOP/s"
                         " (~/.cache/looper), shared by runs",
}
# Calls that make, replace, move or remove a file, by their dotted name's end.
CHANGES = ("gfile.makedirs", "gfile.mkdir", "gfile.rename", "gfile.copy",
           "gfile.remove", "gfile.rmtree", "os.makedirs", "os.mkdir",
           "os.rename", "os.replace", "os.link", "os.symlink", "os.remove",
           "os.unlink", "os.rmdir", "os.open", "shutil.copy",
           "shutil.copyfile", "shutil.copytree", "shutil.move",
           "shutil.rmtree", "io.write_file", "io.TFRecordWriter",
           "summary.create_file_writer")
OPENS = ("open", "io.open", "builtins.open", "gfile.GFile", "gfile.Open")


def _dotted(node: ast.AST) -> str:
  """`tf.io.gfile.GFile` for the call's function; '' for a computed one."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    base = _dotted(node.value)
    return base and f"{base}.{node.attr}"
  return ""


def _is(name: str, patterns) -> bool:
  return any(name == p or name.endswith("." + p) for p in patterns)


def _writes(path: pathlib.Path):
  """(line, call) of each call in the module that writes a file: one of
  CHANGES, or an open whose mode writes (a mode not spelled out counts)."""
  for node in ast.walk(ast.parse(path.read_text())):
    if not isinstance(node, ast.Call):
      continue
    name = _dotted(node.func)
    if _is(name, OPENS):
      mode = (node.args[1:2] or [k.value for k in node.keywords
                                 if k.arg == "mode"] or [None])[0]
      reads = mode is None or (isinstance(mode, ast.Constant) and
                               not set(str(mode.value)) & set("wax+"))
      if not reads:
        yield node.lineno, name
    elif _is(name, CHANGES):
      yield node.lineno, name


def test_the_workdir_package_writes_every_file_of_a_run():
  """looper/workdir/ writes a run's files, and within it `files` alone
  opens one for writing or makes a folder (atomic replace, append,
  exclusive create: one way per store); outside it only NOT_RUN_FILES."""
  found = {}
  for path in sorted((ROOT / "looper").rglob("*.py")):
    module = _module(path)
    calls = list(_writes(path))
    if module.startswith("looper.workdir."):
      calls = [(line, name) for line, name in calls if module !=
               "looper.workdir.files" and (_is(name, OPENS) or "mkdir" in name)]
    if calls:
      found[module] = calls
  assert set(found) == set(NOT_RUN_FILES), {
      m: c for m, c in found.items() if m not in NOT_RUN_FILES}
