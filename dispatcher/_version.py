"""The version of bucket-dispatcher: `dispatcher.__version__`, `dispatcher --version`, the
`dispatcher_build_info` metric, and the distribution's own (pyproject.toml reads it from here).

A literal, not `importlib.metadata.version()`: that scans every distribution on sys.path (5-8 ms
a call here), and the version was read twice at import. Importing a worker took 132-160 ms with
the look-ups and 123-130 ms without (`python -X importtime`), paid by every worker start and
every CLI call."""

__version__ = "0.1.0"
