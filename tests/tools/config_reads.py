"""Who reads the config: each module's reads of `config.<section>.<field>`, by an AST walk.

Synopsis::

    python -m tests.tools.config_reads            # a table: module, reads,
                                                  # sections; the fields read
                                                  # in most modules
    reads = config_reads.scan("looper")           # {module: Counter(field)}
    config_reads.outside(reads)                   # less config.py, run/,
                                                  # main.py and cli/

A read is an attribute chain through a name or an attribute called
`config` (`config.train.steps`, `self.config.data.bucket`,
`input.config.eval.batch_size`), through an alias of one (`c = self.config`
then `c.train.steps`; `data = config.data` then `data.bucket`, or
`value = config.actions` used whole), or a `getattr(config, "train")`.
The field is `section.field` (`train.steps`), or the section alone where
the chain stops there (a block handed on whole). Issue 47 measures the
house by it: outside the composition (config.py, run/, main.py, cli/)
at most 8 modules read the config and no field is read in more than 2
(tests/test_layout.py holds those ceilings); a component that gets its
block in a parameter of its own name (`optimizers.check(opt)`) reads its
block, not the config.
"""

import ast
import collections
import pathlib
import sys

# Modules that compose the config or front the command line: theirs are
# not counted by the rule (issue 47, item 1).
COMPOSERS = ("looper/config.py", "looper/run/", "looper/main.py",
             "looper/cli/")


# Modules with a `config` of their own (TensorFlow's, Keras'), and the
# ConfigDict's methods that are not a field.
NOT_OURS = ("tf", "keras")
METHODS = ("items", "keys", "values", "update", "to_dict", "to_json",
           "to_json_best_effort", "copy_and_resolve_references", "lock",
           "unlock", "unlocked", "ignore_type", "get_type")


def _is_config(node: ast.AST, aliases: dict[str, str]) -> str | None:
  """'' if `node` is the config itself, 'section' if a section of it
  (through an alias), else None."""
  if isinstance(node, ast.Name):
    if node.id == "config":
      return ""
    return aliases.get(node.id)
  if isinstance(node, ast.Attribute) and node.attr == "config":
    if isinstance(node.value, ast.Name) and node.value.id in NOT_OURS:
      return None
    return ""
  return None


def _chain(node: ast.AST, aliases: dict[str, str]) -> str | None:
  """The field an attribute chain `node` reads ('train.steps', 'data'),
  or None if it is not through the config."""
  names = []
  while isinstance(node, ast.Attribute):
    root = _is_config(node, aliases)
    if root is not None:
      break
    names.append(node.attr)
    node = node.value
  root = _is_config(node, aliases)
  if root is None or (not names and not root):
    return None
  path = ([root] if root else []) + names[::-1]
  if set(path[:2]) & set(METHODS) or path[0] == "get":
    return None  # a method of the whole (a `get` is counted as its field)
  return ".".join(path[:2])


def _own_nodes(scope: ast.AST):
  """The nodes of `scope` outside the functions defined in it."""
  todo = list(ast.iter_child_nodes(scope))
  while todo:
    node = todo.pop()
    yield node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.Lambda)):
      todo.extend(ast.iter_child_nodes(node))


def reads_of(source: str) -> collections.Counter:
  """The fields one module's `source` reads (see module doc); an alias
  holds in the function (or module body) that assigns it."""
  tree = ast.parse(source)
  found = collections.Counter()
  if any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
      (a.asname or a.name).split(".")[-1] == "config" for a in n.names)
         for n in ast.walk(tree)):
    return found  # `config` is a module there (TensorFlow's), not ours
  scopes = [tree, *(n for n in ast.walk(tree) if isinstance(
      n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))]
  for scope in scopes:
    nodes = list(_own_nodes(scope))
    aliases: dict[str, str] = {}  # name -> '' (the config) or its section
    named = set()
    for node in nodes:
      if (isinstance(node, ast.Assign) and len(node.targets) == 1 and
          isinstance(node.targets[0], ast.Name)):
        if _is_config(node.value, {}) == "":
          aliases[node.targets[0].id] = ""
        elif (isinstance(node.value, ast.Attribute) and
              _is_config(node.value.value, {}) == ""):
          aliases[node.targets[0].id] = node.value.attr
          named.add(node.value)  # read where the alias is
    inner = set(named)  # and the shorter chains inside one counted
    unread = {name for name, section in aliases.items() if section}
    for node in sorted((n for n in nodes if isinstance(n, ast.Attribute)),
                       key=lambda n: (n.lineno, n.col_offset, -n.end_col_offset)):
      if node in inner:
        continue
      field = _chain(node, aliases)
      if field:
        found[field] += 1
        root = node
        while isinstance(root, ast.Attribute):
          root = root.value
        unread.discard(getattr(root, "id", None))
        part = node.value
        while isinstance(part, ast.Attribute):
          inner.add(part)
          part = part.value
    for name in unread:  # an alias of a field used whole: read there
      found[aliases[name]] += 1
    for node in nodes:  # getattr(config, "train"), config.get("train")
      if not (isinstance(node, ast.Call) and node.args and isinstance(
          node.args[-1 if len(node.args) < 2 else 1], ast.Constant)):
        continue
      func = node.func
      if (isinstance(func, ast.Name) and func.id == "getattr" and
          len(node.args) >= 2 and _is_config(node.args[0], aliases) == ""):
        found[str(node.args[1].value)] += 1
      elif (isinstance(func, ast.Attribute) and func.attr == "get" and
            isinstance(node.args[0], ast.Constant)):
        root = _is_config(func.value, aliases)
        if root is not None:
          found[".".join(filter(None, [root, str(node.args[0].value)]))] += 1
  return found


def scan(package: str = "looper") -> dict[str, collections.Counter]:
  """{module path: the fields it reads} for every module of `package`."""
  root = pathlib.Path(__file__).resolve().parents[2]
  out = {}
  for path in sorted((root / package).rglob("*.py")):
    found = reads_of(path.read_text())
    if found:
      out[str(path.relative_to(root))] = found
  return out


def outside(reads: dict[str, collections.Counter]
            ) -> dict[str, collections.Counter]:
  """`reads` less the composers' (COMPOSERS)."""
  return {m: r for m, r in reads.items() if not m.startswith(COMPOSERS)}


def spread(reads: dict[str, collections.Counter]) -> collections.Counter:
  """How many modules read each field."""
  return collections.Counter(f for r in reads.values() for f in r)


def main() -> int:
  reads = scan()
  print(f"{'module':40} {'reads':>5}  sections")
  for module, found in sorted(reads.items(), key=lambda kv: -sum(
      kv[1].values())):
    sections = sorted({f.split(".")[0] for f in found})
    print(f"{module:40} {sum(found.values()):5}  {', '.join(sections)}")
  rest = outside(reads)
  print(f"\noutside {', '.join(COMPOSERS)}: {len(rest)} modules read the"
        " config; the fields read in most of them:")
  for field, modules in spread(rest).most_common(10):
    print(f"  {field:32} {modules} modules")
  return 0


if __name__ == "__main__":
  sys.exit(main())
