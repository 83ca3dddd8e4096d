"""Named SQL queries: parsed once from a `.sql` file with `-- name: X` headers (procrastinate's
layout).

Generic over the package: `load("coordinator")` reads coordinator/sql/queries.sql;
`load_all("dispatcher.db")` merges every `.sql` file of dispatcher/db/sql/ (split by concern),
refusing a name defined in two of them, and the dispatcher builds its own `query(name)` on it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_named_queries(text: str) -> dict[str, str]:
    """Split a file into {name: statement}. Comment lines inside a query are dropped."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip()
        if not statement:
            raise ValueError(f"query {name!r} is empty")
        queries[name] = statement
    return queries


@cache
def load(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """{name: statement} of `<package>/sql/<filename>`, read once."""
    text = resources.files(package).joinpath("sql", filename).read_text(encoding="utf-8")
    return parse_named_queries(text)


@cache
def load_all(package: str) -> dict[str, str]:
    """{name: statement} of every `<package>/sql/*.sql` file (not the migrations), read once.
    ValueError for a name that two files define: `query(name)` must find exactly one."""
    folder = resources.files(package).joinpath("sql")
    found: dict[str, str] = {}
    where: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql") or not entry.is_file():
            continue
        for name, statement in load(package, entry.name).items():
            if name in found:
                raise ValueError(
                    f"query {name!r} is defined in both {where[name]} and {entry.name}"
                )
            found[name], where[name] = statement, entry.name
    return found
