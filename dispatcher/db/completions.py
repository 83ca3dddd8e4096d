"""The completion statements a store sends, composed once per DISPATCHER_COMPLETED_JOBS from the
named queries: the fenced keyless completion (sql/finish.sql: which ids it refused), the keyed one
that promotes each key's next job (sql/ordering.sql), and under `delete` the closing of uniqueness
windows (sql/dedupe.sql) in the same statement."""

from __future__ import annotations

from dispatcher.constants import COMPLETED_DELETE
from dispatcher.db.queries import query

# Where jobs_complete_owned_keyed's `released` ends: the keyed completion under delete closes
# windows from there (sql/dedupe.sql).
_RELEASED = "    RETURNING j.id, j.queue_name, j.ordering_key, j.has_dependents, j.awaited\n),\n"


def closing_keyed(keyed: str) -> str:
    """The keyed completion under DISPATCHER_COMPLETED_JOBS=delete, given without: each deleted job
    that had a uniqueness window leaves its finish time in it, in the same statement."""
    if _RELEASED not in keyed:
        raise ValueError("jobs_complete_owned_keyed changed shape: update completions._RELEASED")
    released = _RELEASED.replace("j.awaited", "j.awaited, j.dedupe_key, j.dedupe_window_s")
    return keyed.replace(_RELEASED, released + query("dedupe_windows_close_released") + ",\n")


def completion_statements(completed_jobs: str) -> dict[bool, str]:
    """{keyed: statement}: without keys, the fenced completion (it answers which ids it refused);
    with keys, the completion inside the statement that also promotes each key's next job (a batch
    without keys pays nothing for them). Under `delete`, both close uniqueness windows too."""
    complete = query(
        "jobs_complete_owned_delete"
        if completed_jobs == COMPLETED_DELETE
        else "jobs_complete_owned"
    )
    keyed = query("jobs_complete_owned_keyed").replace("{completion}", complete)
    if completed_jobs != COMPLETED_DELETE:
        return {
            False: query("jobs_complete_owned_fenced").replace("{completion}", complete),
            True: keyed,
        }
    return {
        False: query("jobs_complete_owned_delete_fenced").replace("{completion}", complete),
        True: closing_keyed(keyed),
    }
