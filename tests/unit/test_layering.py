"""Layering: `dispatcher` uses `coordinator`, never the other way round, and inside `dispatcher`
no import runs back up a layer.

Every module is parsed (not imported) and every import it makes is resolved to an absolute module
name: plain and from-imports, relative ones (`from .. import dispatcher`), imports under
`if TYPE_CHECKING:` or inside functions, and `importlib.import_module("...")` / `__import__("...")`
with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = "dispatcher"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, the code of `module`."""
    package = module if is_package else module.rpartition(".")[0]
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(base)
            else:
                prefix = ""
            target = ".".join(p for p in (prefix, node.module or "") if p)
            if node.module:
                names.append((node.lineno, target))
            else:  # `from . import x` / `from .. import dispatcher`: the names are the modules
                names += [
                    (node.lineno, ".".join(p for p in (target, alias.name) if p))
                    for alias in node.names
                ]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.append((node.lineno, node.args[0].value))
    return names


def forbidden_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    return [
        f"line {line}: {name}"
        for line, name in imported_names(source, module, is_package)
        if name == FORBIDDEN or name.startswith(FORBIDDEN + ".")
    ]


def coordinator_modules() -> list[Path]:
    found = sorted((ROOT / "coordinator").rglob("*.py"))
    assert found, "no coordinator modules found"
    return found


@pytest.mark.parametrize("path", coordinator_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_coordinator_imports_nothing_from_dispatcher(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    bad = forbidden_imports(source, _module_name(path, ROOT), path.name == "__init__.py")
    assert not bad, f"{path.relative_to(ROOT)} imports from dispatcher: {bad}"


@pytest.mark.parametrize(
    "source, module",
    [
        ("from dispatcher.errors import DispatcherError", "coordinator.backend"),
        ("import dispatcher.constants", "coordinator.assignment"),
        ("import dispatcher", "coordinator.assignment"),
        ("from dispatcher import queries", "coordinator.backend_pg"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from "
            "dispatcher.settings.config import Config",
            "coordinator.factory",
        ),
        ("def f():\n    from dispatcher.backoff import jittered", "coordinator.coordinator"),
        ("from .. import dispatcher", "coordinator.backend"),
        ("from ..dispatcher.queries import query", "coordinator.backend"),
        ("from ...dispatcher import x", "coordinator.sub.mod"),
        ("import importlib\nimportlib.import_module('dispatcher.constants')", "coordinator.x"),
    ],
)
def test_the_check_catches_every_spelling(source: str, module: str) -> None:
    assert forbidden_imports(source, module)


@pytest.mark.parametrize(
    "source, module",
    [
        ("from .errors import CoordinatorError", "coordinator.backend"),
        ("from coordinator.buckets import NUM_BUCKETS", "coordinator.assignor"),
        (
            "import dispatcher_tools",
            "coordinator.x",
        ),  # a different package that merely starts alike
        ("from . import metrics", "coordinator.coordinator"),
    ],
)
def test_the_check_allows_the_coordinators_own_imports(source: str, module: str) -> None:
    assert not forbidden_imports(source, module)


# dispatcher's layers, lowest first: a module may import its own layer and the ones below it.
# `base` is the package's top-level modules (model, constants, errors, backoff, _version), but
# those in PLACED.
LAYERS = (
    "base",
    "observe",
    "settings",
    "db",
    "api",
    "runtime",
    "serve",
    "web",
    "testing",
    "devtools",
    "cli",
)
# The package's faces re-export the public API from every layer; `python -m dispatcher` is the CLI.
FACES = ("dispatcher", "dispatcher.__main__")
# Top-level modules that belong to a layer above the base, for the name their users import:
# dispatcher.admin, the operator's API (the job admin, and api/'s flow control and schedules).
PLACED = {"dispatcher.admin": "api"}


def layer_of(module: str) -> str:
    if module in PLACED:
        return PLACED[module]
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS else "base"


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of `module` that name a dispatcher module of a higher layer than its own."""
    rank = LAYERS.index(layer_of(module))
    return [
        f"line {line}: {name} ({layer_of(name)})"
        for line, name in imported_names(source, module, is_package)
        if name.startswith("dispatcher.") and LAYERS.index(layer_of(name)) > rank
    ]


def dispatcher_modules() -> list[Path]:
    found = sorted((ROOT / "dispatcher").rglob("*.py"))
    assert found, "no dispatcher modules found"
    return [p for p in found if _module_name(p, ROOT) not in FACES]


@pytest.mark.parametrize("path", dispatcher_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dispatcher_import_runs_up_a_layer(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    bad = upward_imports(source, _module_name(path, ROOT), path.name == "__init__.py")
    assert not bad, (
        f"{path.relative_to(ROOT)} ({layer_of(_module_name(path, ROOT))}) "
        f"imports a higher layer: {bad}"
    )


def test_every_subpackage_of_dispatcher_is_a_known_layer() -> None:
    subpackages = {p.parent.name for p in (ROOT / "dispatcher").glob("*/__init__.py")}
    assert subpackages <= set(LAYERS), (
        f"unknown layers: {subpackages - set(LAYERS)}: add them to LAYERS"
    )


@pytest.mark.parametrize(
    "source, module",
    [
        ("from dispatcher.serve.worker import Worker", "dispatcher.runtime.producer"),
        ("from dispatcher.runtime.retry import RetryPolicy", "dispatcher.db.rows"),
        ("from ..runtime import metrics", "dispatcher.db.store"),
        ("from dispatcher.cli.commands import main", "dispatcher.devtools.demo"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dispatcher.admin import "
            "x",
            "dispatcher.model",
        ),
        ("from dispatcher.serve.health import Health", "dispatcher.admin"),
        ("from dispatcher.runtime.janitor import Pruner", "dispatcher.api.schedules.round"),
        ("def f():\n    from dispatcher.settings.config import Config", "dispatcher.observe.logs"),
    ],
)
def test_the_layer_check_catches_upward_imports(source: str, module: str) -> None:
    assert upward_imports(source, module)


@pytest.mark.parametrize(
    "source, module",
    [
        ("from dispatcher.db.store import JobStore", "dispatcher.runtime.producer"),
        ("from dispatcher.model import Job", "dispatcher.db.rows"),
        ("from . import health", "dispatcher.serve.worker"),
        ("from dispatcher.devtools import demo", "dispatcher.cli.commands"),
        ("from coordinator.pg.connect import connect", "dispatcher.db.store"),
        ("from dispatcher.admin import AdminInputError", "dispatcher.api.flow"),
        ("from dispatcher.api.schedules.declarations import Schedule", "dispatcher.api.registry"),
    ],
)
def test_the_layer_check_allows_downward_and_sideways_imports(source: str, module: str) -> None:
    assert not upward_imports(source, module)


def pg_plumbing_modules() -> list[Path]:
    found = sorted((ROOT / "coordinator" / "pg").rglob("*.py"))
    assert found, "no coordinator/pg modules found"
    return found


@pytest.mark.parametrize("path", pg_plumbing_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_postgres_plumbing_imports_nothing_else_of_ours(path: Path) -> None:
    """coordinator/pg/ sits under both packages: it may not import the coordinator that uses it."""
    names = imported_names(
        path.read_text(encoding="utf-8"), _module_name(path, ROOT), path.name == "__init__.py"
    )
    bad = [
        f"line {line}: {name}"
        for line, name in names
        if name.split(".")[0] in ("coordinator", "dispatcher")
        and not name.startswith("coordinator.pg")
    ]
    assert not bad, f"{path.relative_to(ROOT)} imports above the plumbing: {bad}"
