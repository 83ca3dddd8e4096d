"""bench/ uses the project through its public faces only, so the runtime's modules can change
freely.

Allowed: `dispatcher` (the API), `dispatcher.db` (the database layer's face: named queries, the
claim statement's text, array literals, migrate), `dispatcher.devtools` and its modules (the
throwaway servers, the harness), `dispatcher.testing`, `dispatcher.web.reads` and
`dispatcher.web.chart_reads` (the dashboard's reads, which bench/dashboard_cost.py times), and
`coordinator.pg` with its modules (the shared PostgreSQL plumbing: DSN redaction, the named-query
loader). Any other module of dispatcher/ or coordinator/, and any name or module with a leading
underscore, is refused. Every import counts, at the top of a module or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PUBLIC_FACES = (
    "dispatcher",
    "dispatcher.db",
    "dispatcher.devtools",
    "dispatcher.devtools.*",
    "dispatcher.testing",
    "dispatcher.web.reads",
    "dispatcher.web.chart_reads",
    "coordinator.pg",
    "coordinator.pg.*",
)


def is_public_face(module: str) -> bool:
    return any(
        module == face
        or (
            face.endswith(".*")
            and module.startswith(face[:-1])
            and "." not in module[len(face) - 1 :]
        )
        for face in PUBLIC_FACES
    )


def violations(source: str) -> list[str]:
    """Each import of `source` that reaches past the public faces, as 'line N: what'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in imported:
            if module.split(".")[0] not in ("dispatcher", "coordinator"):
                continue
            if name is not None and name.startswith("_"):
                found.append(f"line {node.lineno}: private name {name} of {module}")
            elif not is_public_face(module) and not (name and is_public_face(f"{module}.{name}")):
                found.append(f"line {node.lineno}: {module} is not a public face")
            elif any(part.startswith("_") for part in module.split(".")):
                found.append(f"line {node.lineno}: private module {module}")
    return found


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_imports_public_faces_only(path: Path) -> None:
    assert violations(path.read_text()) == []


def test_the_bench_is_there() -> None:
    assert len(list(BENCH.glob("*.py"))) > 5


@pytest.mark.parametrize(
    "line",
    [
        "from dispatcher.db.store import claim_sql",
        "from dispatcher.constants import NUM_BUCKETS",
        "from dispatcher.api.enqueue import enqueue_sync",
        "from dispatcher.db import _private",
        "from dispatcher.devtools.embedded import _Server",
        "import dispatcher.db.queries",
        "from coordinator.backend import Backend",
        "from coordinator import backend",
        "from dispatcher import _version",
        "def f():\n    from dispatcher.errors import DispatcherError",
    ],
)
def test_reaching_past_a_face_is_refused(line: str) -> None:
    assert len(violations(line)) == 1, line


@pytest.mark.parametrize(
    "line",
    [
        "from dispatcher import JobSpec, enqueue_sync",
        "from dispatcher.db import claim_sql, query",
        "from dispatcher.devtools import harness",
        "from dispatcher.devtools.embedded import start_postgres",
        "from coordinator.pg.sqlfile import load",
        "import dispatcher",
        "from bench.core import _fmt",
        "import psycopg",
    ],
)
def test_the_public_faces_are_allowed(line: str) -> None:
    assert violations(line) == []
