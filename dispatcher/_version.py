"""The version of bucket-dispatcher: `dispatcher.__version__`, `dispatcher --version`, the
`dispatcher_build_info` metric, and the distribution's own (pyproject.toml reads it from here).
A literal, not importlib.metadata (its cost at import: docs/design/worker.md)."""

__version__ = "0.1.0"
