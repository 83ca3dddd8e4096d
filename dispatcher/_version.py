"""The version of bucket-dispatcher: `dispatcher.__version__`, `dispatcher --version`, the
`dispatcher_build_info` metric, and the distribution's own (pyproject.toml reads it from here).

A literal, not `importlib.metadata.version()`: that scans every distribution on sys.path, 25 of
the 130 ms a worker process took to import (`python -X importtime`), paid by every worker start
and every CLI call."""

__version__ = "0.1.0"
