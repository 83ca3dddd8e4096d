"""No import cycle among the modules of `dispatcher` and `coordinator`.

Every module is parsed (not imported) and every import it names is an edge: at the top, under
`if TYPE_CHECKING:` and inside functions alike, since each is a dependency that a layer below
must not have on a layer above (health.py once read the worker, the worker wired health). A
package's `__init__` counts only where it is named itself: `from dispatcher.observe import
metrics` is an edge to dispatcher.observe.metrics.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dispatcher", "coordinator")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        _module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
    }


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The known modules `source` (the code of `module`) imports, wherever the import stands."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from pkg import mod` names a module; `from mod import x` does not
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return {name for name in found if name in known and name != module}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {
        name: imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known)
        for name, path in found.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one importing itself
    (Tarjan's algorithm, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def test_the_packages_have_no_import_cycle() -> None:
    graph = import_graph()
    assert "dispatcher.serve.health" in graph and "coordinator.coordinator" in graph
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"a"}}, [["a"]]),
    ],
)
def test_the_cycle_finder(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_imports_are_resolved_wherever_they_stand() -> None:
    known = {"p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d"}
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import Thing\n"
        "def f():\n    from . import b\n    import p.c\nfrom .sub import d\nfrom ..x import y\n"
    )
    assert imports_of(source, "p.m", False, known) == {"p.a", "p.b", "p.c", "p.sub.d"}
