"""The documentation's shape: the site builds, and the two top-level files
stay the size a reader can take in.

- `mkdocs build --strict` of docs/mkdocs.yml passes: no broken link or
  anchor, no page outside the nav (MkDocs' own checks, turned into errors
  by `validation:` and `--strict`), and every page is in the nav.
- README.md: at most 250 lines, none over 100 characters outside code
  blocks (the landing page: a few screens).
- BUILD.md: at most 40 KB, no line over 100 characters, tables included
  (the design document, read in half an hour).

Synopsis::

    pip install -e ".[docs]"
    mkdocs serve -f docs/mkdocs.yml       # the site at 127.0.0.1:8000
"""

import os
import re
import subprocess
import sys

from tests.fixtures import needs
from tests.fixtures.paths import ROOT

DOCS = ROOT / "docs"
WIDTH = 100


def _long_lines(text: str, *, outside_code: bool) -> list[tuple[int, int]]:
  """(line number, length) of each line wider than WIDTH."""
  long, in_code = [], False
  for number, line in enumerate(text.splitlines(), 1):
    if outside_code and line.startswith("```"):
      in_code = not in_code
      continue
    if len(line) > WIDTH and not in_code:
      long.append((number, len(line)))
  return long


def test_readme_is_a_landing_page():
  text = (ROOT / "README.md").read_text()
  assert len(text.splitlines()) <= 250, len(text.splitlines())
  assert not _long_lines(text, outside_code=True)


def test_build_md_is_read_in_half_an_hour():
  data = (ROOT / "BUILD.md").read_bytes()
  assert len(data) <= 40 * 1024, f"{len(data) / 1024:.1f} KB"
  assert not _long_lines(data.decode(), outside_code=False)


def _nav_pages() -> set[str]:
  """The page files docs/mkdocs.yml's nav names (`Title: file.md` lines)."""
  config = (DOCS / "mkdocs.yml").read_text()
  nav = config[config.index("\nnav:"):]
  return set(re.findall(r":\s+([\w-]+\.md)\s*$", nav, re.M))


def test_every_page_is_in_the_nav():
  pages = {p.name for p in (DOCS / "pages").glob("*.md")}
  assert pages == _nav_pages()


def test_the_site_builds_strictly(tmp_path):
  needs.extra("mkdocs", "docs")
  needs.extra("material", "docs")
  proc = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
       "-f", str(DOCS / "mkdocs.yml"), "-d", str(tmp_path / "site")],
      capture_output=True, text=True, timeout=120, check=False,
      env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
  assert built == {name[:-3] for name in _nav_pages()} - {"index"}
