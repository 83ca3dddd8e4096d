"""docs/guides/development.md's layout table names every module and subpackage of dispatcher/ and
coordinator/, one row each, and nothing that is gone.

A row's first cell is one path in backquotes: a module (`dispatcher/runtime/producer.py`), a
subpackage (`dispatcher/web/`, any folder holding Python) or another folder that exists
(`dispatcher/db/sql/`). `__init__.py` files are their package's row. A new module needs one row.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guides" / "development.md"
TREES = ("dispatcher", "coordinator")
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def layout_section(text: str) -> str:
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def named_paths(text: str) -> list[str]:
    """The first cell of each row of the Layout section's table, in order."""
    return [m.group(1) for line in layout_section(text).splitlines() if (m := ROW.match(line))]


def modules_and_packages(root: Path) -> set[str]:
    """Every module (but __init__.py) and every folder holding Python, of the trees, as the table
    writes them: relative paths, folders with a trailing slash."""
    found: set[str] = set()
    for tree in TREES:
        for path in (root / tree).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root)
            found.add(f"{rel.parent.as_posix()}/")
            if path.name != "__init__.py":
                found.add(rel.as_posix())
    return found


def test_the_table_is_found() -> None:
    assert len(named_paths(DOC.read_text(encoding="utf-8"))) > 50


def test_every_module_and_subpackage_has_its_row() -> None:
    named = set(named_paths(DOC.read_text(encoding="utf-8")))
    missing = sorted(modules_and_packages(ROOT) - named)
    assert not missing, f"add a row to the Layout table of {DOC.relative_to(ROOT)} for: {missing}"


def test_every_row_names_a_path_that_exists_once() -> None:
    named = named_paths(DOC.read_text(encoding="utf-8"))
    gone = [p for p in named if not (ROOT / p).exists() or p.endswith("/") != (ROOT / p).is_dir()]
    assert not gone, f"the Layout table of {DOC.relative_to(ROOT)} names what is not there: {gone}"
    twice = sorted({p for p in named if named.count(p) > 1})
    assert not twice, f"named twice: {twice}"


def test_the_check_reads_rows_and_trees_as_meant(tmp_path: Path) -> None:
    text = (
        "# Dev\n\n## Layout\n\n| module | what |\n|---|---|\n| `pkg/` | x |\n| `pkg/a.py` | a "
        "`b.py` in prose is not a row |\n\n## Next\n| `pkg/z.py` | another section |\n"
    )
    assert named_paths(text) == ["pkg/", "pkg/a.py"]
    for rel in ("dispatcher/__init__.py", "dispatcher/web/views.py", "coordinator/pg/dsn.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "dispatcher" / "web" / "__pycache__").mkdir()
    (tmp_path / "dispatcher" / "web" / "__pycache__" / "views.py").write_text("")
    assert modules_and_packages(tmp_path) == {
        "dispatcher/",
        "dispatcher/web/",
        "dispatcher/web/views.py",
        "coordinator/pg/",
        "coordinator/pg/dsn.py",
    }
