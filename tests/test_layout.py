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
