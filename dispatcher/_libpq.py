"""psycopg with a libpq to drive, or one ImportError that says how to get one.

The package depends on the pure psycopg (pyproject.toml), which needs a libpq: the `binary` extra's
wheel carries its own, the `c` extra builds against the system's, or the system has one. Without
any, psycopg's ImportError lists the wrappers it tried but no way out; this one names ours.
dispatcher/__init__.py imports this module first, so `import dispatcher` and every `dispatcher`
command meet it before anything else.
"""

from __future__ import annotations

# Keep equal to the `binary` extra of pyproject.toml (a test does).
BINARY_REQUIREMENT = "psycopg[binary]>=3.2"
HINT = (
    f"install the `binary` extra (pip install '{BINARY_REQUIREMENT}': a wheel with libpq inside), "
    "or the system's libpq (Debian and Ubuntu: apt-get install libpq5)"
)

try:
    import psycopg  # noqa: F401  # psycopg loads its libpq wrapper at import
except ModuleNotFoundError:
    raise  # psycopg itself is missing: its own message says so
except ImportError as exc:
    said = " ".join(str(exc).split())  # psycopg's lines, on one
    raise ImportError(f"psycopg found no libpq: {HINT}. psycopg said: {said}") from None
