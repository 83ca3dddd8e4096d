"""The dispatcher's named SQL queries (dispatcher/db/sql/queries.sql), on the coordinator's loader."""

from __future__ import annotations

from coordinator.pg.sqlfile import load


def query(name: str) -> str:
    return load("dispatcher.db")[name]
