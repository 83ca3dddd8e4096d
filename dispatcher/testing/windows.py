"""The in-memory store's dedupe keys and uniqueness windows: the dedupe index's and
sql/dedupe.sql's rules over a dict.

A live job holds its dedupe key in its whole queue, as the queue-wide dedupe index does on one
node (migration 0014 keeps it; a Citus cluster holds the rule per bucket). One window per (queue,
dedupe_key): the key's last job enqueued with `dedupe_window_s`. It holds the key while that job
is live, and for its window after the job finished: `updated_at` while its row exists, the time
its row was deleted (by a completion under 'delete') after that.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher.db.port import NewJob
from dispatcher.db.rows import JobState
from dispatcher.model import STATUS_QUEUED, STATUS_RUNNING, STATUS_WAITING

_LIVE = (STATUS_QUEUED, STATUS_RUNNING, STATUS_WAITING)


@dataclass(slots=True)
class _Window:
    job_id: int
    window_s: float
    enqueued_at: datetime
    finished_at: datetime | None = None


class DedupeWindows:
    """The windows, and which jobs have one; `refuses` is an enqueue's whole dedupe rule. Callers
    hold the store's lock."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str], _Window] = {}

    def refuses(
        self,
        job: NewJob,
        rows: Mapping[int, JobState],
        now: datetime,
        before: Collection[tuple[str, str | None]] = (),
    ) -> bool:
        """Whether the job's dedupe key keeps it out: a live job of its queue holds it; or, for a
        job with a window, a window does, or a job `before` it in its batch has it
        (dedupe_stage_refuse: one window names one job)."""
        key = job.dedupe_key
        if key is None:
            return False
        windowed = getattr(job, "dedupe_window_s", None) is not None
        return any(
            r.dedupe_key == key and r.queue == job.queue and r.status in _LIVE
            for r in rows.values()
        ) or (windowed and ((job.queue, key) in before or self.held(job.queue, key, rows, now)))

    def held(self, queue: str, key: str, rows: Mapping[int, JobState], now: datetime) -> bool:
        """Whether a window holds (queue, key) at `now` (dedupe_window_until in sql/dedupe.sql)."""
        window = self._windows.get((queue, key))
        if window is None:
            return False
        row = rows.get(window.job_id)
        if row is not None and row.status in _LIVE:
            return True
        finished = row.updated_at if row is not None else window.finished_at or window.enqueued_at
        return now < finished + timedelta(seconds=window.window_s)

    def open(self, queue: str, key: str, job_id: int, window_s: float, now: datetime) -> None:
        self._windows[(queue, key)] = _Window(job_id, window_s, now)

    def deleted(self, row: JobState, now: datetime) -> None:
        """`row`'s job was deleted as it finished: its window, if it is still the key's, counts
        from now."""
        window = (
            self._windows.get((row.queue, row.dedupe_key)) if row.dedupe_key is not None else None
        )
        if window is not None and window.job_id == row.id:
            window.finished_at = now
