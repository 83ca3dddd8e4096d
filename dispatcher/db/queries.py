"""The dispatcher's named SQL queries: every `.sql` file of dispatcher/db/sql/ (claim, finish,
ordering, maintenance, admin, enqueue, observe, migrate), on the coordinator's loader.

Fragments shared by several statements are filled in here (_FRAGMENTS; a fragment may hold others):
what a claim writes on the rows it takes (sql/claim.sql); the CTEs that promote the next job of
each ordering key a statement released, or claim it for the completing worker (sql/ordering.sql);
the uniqueness windows' end and the check of a dedupe key (sql/dedupe.sql)."""

from __future__ import annotations

from functools import cache

from coordinator.pg.sqlfile import load_all

_FRAGMENTS = {
    "{mark_running}": "claim_mark_running",
    "{promote_next}": "ordering_promote_next",
    "{sharded_promote_next}": "sharded_promote_next",
    "{chain_next}": "ordering_chain_next",
    "{next_jobs}": "ordering_next_jobs",
    "{queue_jobs}": "ordering_queue_jobs",
    "{key_held}": "dedupe_key_held",
    "{window_until}": "dedupe_window_until",
    "{close_windows}": "dedupe_windows_close",
    "{close_batch_windows}": "dedupe_windows_close_batch",
}


@cache
def query(name: str) -> str:
    """The statement named `name`, from whichever file defines it (a name in two files is refused),
    with its fragments filled in."""
    queries = load_all("dispatcher.db")
    text = queries[name]
    while any(placeholder in text for placeholder in _FRAGMENTS):
        for placeholder, fragment in _FRAGMENTS.items():
            text = text.replace(placeholder, queries[fragment])
    return text
