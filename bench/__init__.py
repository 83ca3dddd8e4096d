"""Benchmark suite: `python -m bench SCENARIO ...` (see bench/__main__.py)."""
