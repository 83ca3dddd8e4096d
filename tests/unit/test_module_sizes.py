"""No module of dispatcher/, coordinator/ or bench/ runs away past 600 lines.

A guard, not a budget: `ruff format` holds the width, and a module's size follows from its one
job. One that reaches the bound is most likely doing two: split it by job, as
dispatcher/settings/ splits the fields from their rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 600
MODULES = sorted(
    p for tree in ("dispatcher", "coordinator", "bench") for p in (REPO / tree).rglob("*.py")
)


def test_the_trees_are_there() -> None:
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_module_stays_under_the_runaway_bound(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)}: {lines} lines"
