"""The completion statements a store sends, composed once per DISPATCHER_COMPLETED_JOBS from the
named queries: the fenced keyless completion (sql/finish.sql: which ids it refused), the keyed one
that promotes each key's next job (sql/ordering.sql); under `delete` and `archive` the closing of
uniqueness windows (sql/dedupe.sql) in the same statement, and under `archive` the insert of the
deleted rows into the archive (sql/archive.sql), also in the same statement."""

from __future__ import annotations

import re

from dispatcher.constants import COMPLETED_ARCHIVE, COMPLETED_DELETE, COMPLETED_KEEP
from dispatcher.db.queries import query

# Where jobs_complete_owned_keyed's `released` ends: the keyed completion under delete closes
# windows from there (sql/dedupe.sql).
_RELEASED = "    RETURNING j.id, j.queue_name, j.ordering_key, j.has_dependents, j.awaited\n),\n"
# The completion's CTE in each completion statement: where a CTE starts, and the completion's
# RETURNING line with the CTE's end.
_CTE_START = re.compile(r"^(?:WITH )?(\w+) AS \($", re.M)
_RETURNING = re.compile(r"^    RETURNING j\.[^\n]*\n\),?\n", re.M)


def closing_keyed(keyed: str) -> str:
    """The keyed completion under DISPATCHER_COMPLETED_JOBS=delete, given without: each deleted job
    that had a uniqueness window leaves its finish time in it, in the same statement."""
    if _RELEASED not in keyed:
        raise ValueError("jobs_complete_owned_keyed changed shape: update completions._RELEASED")
    released = _RELEASED.replace("j.awaited", "j.awaited, j.dedupe_key, j.dedupe_window_s")
    return keyed.replace(_RELEASED, released + query("dedupe_windows_close_released") + ",\n")


def archived(moved: str) -> str:
    """The CTE that appends the rows CTE `moved` deleted (returning j.*) to the archive."""
    return query("jobs_archive_insert").replace("{moved}", moved)


def archiving(statement: str) -> str:
    """`statement`, a deleting completion, with the rows its completion CTE deletes appended to
    the archive in the same statement: the CTE returns whole rows, and `archived` follows it."""
    returning = _RETURNING.search(statement)
    starts = [] if returning is None else list(_CTE_START.finditer(statement, 0, returning.start()))
    deleting = query("jobs_complete_owned_delete").strip()
    if (
        returning is None
        or not starts
        or deleting not in statement[starts[-1].end() : returning.start()]
    ):
        raise ValueError("a completion changed shape: update completions._RETURNING")
    after = ",\n" if returning.group(0).endswith("),\n") else "\n"
    archive = f"    RETURNING j.*\n),\n{archived(starts[-1].group(1))}{after}"
    return statement[: returning.start()] + archive + statement[returning.end() :]


def completion_statements(completed_jobs: str) -> dict[bool, str]:
    """{keyed: statement}: without keys, the fenced completion (it answers which ids it refused);
    with keys, the completion inside the statement that also promotes each key's next job (a batch
    without keys pays nothing for them). Under `delete` and `archive`, both close uniqueness
    windows too; under `archive`, both append the deleted rows to the archive."""
    complete = query(
        "jobs_complete_owned" if completed_jobs == COMPLETED_KEEP else "jobs_complete_owned_delete"
    )
    keyed = query("jobs_complete_owned_keyed").replace("{completion}", complete)
    if completed_jobs == COMPLETED_KEEP:
        return {
            False: query("jobs_complete_owned_fenced").replace("{completion}", complete),
            True: keyed,
        }
    deleting = {
        False: query("jobs_complete_owned_delete_fenced").replace("{completion}", complete),
        True: closing_keyed(keyed),
    }
    if completed_jobs == COMPLETED_DELETE:
        return deleting
    assert completed_jobs == COMPLETED_ARCHIVE
    return {keyed_: archiving(statement) for keyed_, statement in deleting.items()}
