"""The dispatcher's named SQL queries (dispatcher/sql/queries.sql), on the coordinator's loader."""

from __future__ import annotations

from coordinator.sqlfile import load


def query(name: str) -> str:
    return load("dispatcher")[name]
