"""The dispatcher's named SQL queries (dispatcher/sql/queries.sql), on the coordinator's loader."""

from __future__ import annotations

from coordinator.sqlfile import load, parse_named_queries

__all__ = ["load", "parse_named_queries", "query"]


def query(name: str) -> str:
    return load("dispatcher")[name]
