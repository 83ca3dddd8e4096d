"""The dispatcher's named SQL queries: every `.sql` file of dispatcher/db/sql/ (claim, finish,
maintenance, admin, enqueue, observe, migrate), on the coordinator's loader."""

from __future__ import annotations

from coordinator.pg.sqlfile import load_all


def query(name: str) -> str:
    """The statement named `name`, from whichever file defines it (a name in two files is refused)."""
    return load_all("dispatcher.db")[name]
