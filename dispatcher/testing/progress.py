"""Progress and metadata reports (`Job.set_progress`, `Job.update_meta`) without a worker or a
database: the in-memory store's fenced write of them, and `ProgressLog`, where dispatcher.testing
records what handlers report.

`perform_job` records a handler's reports in a ProgressLog (`recorded_progress()` hands it to the
test); the `Runner` writes them into its MemoryStore at once, fenced like a worker's batched
write, so `store.get(job_id).progress` and `.meta` read what `dispatcher jobs show` would.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from dispatcher.db.progress import ProgressReport, ProgressWritten
from dispatcher.db.rows import JobState
from dispatcher.job_reports import STORED_META_BYTES, merged_meta, progress_json
from dispatcher.model import PROGRESS_SINK, Job, ProgressSink


class ProgressInMemory:
    """MemoryStore's jobs_report_progress (its rows, lock and fence are MemoryStore's own)."""

    _lock: threading.RLock

    def _owned(self, job_id: int, token: str) -> JobState | None:
        raise NotImplementedError

    def _write(self, row: JobState, token: str | None = None, **changes: Any) -> JobState:
        raise NotImplementedError

    def report_progress(self, reports: Sequence[ProgressReport]) -> list[ProgressWritten]:
        """The port's jobs_report_progress, callable without an event loop: written where the job
        runs under the report's token (the others are fenced); a meta merge that would make the
        stored meta longer than PostgreSQL's text of it may be is refused, as there."""
        written: list[ProgressWritten] = []
        with self._lock:
            for report in reports:
                row = self._owned(report.id, report.token)
                if row is None:
                    continue
                changes: dict[str, Any] = {}
                if report.progress is not None:
                    changes["progress"] = orjson.loads(report.progress)
                refused = False
                if report.meta is not None:
                    merged = {**(row.meta or {}), **orjson.loads(report.meta)}
                    refused = len(_as_postgres_text(merged)) > STORED_META_BYTES
                    if not refused:
                        changes["meta"] = merged
                self._write(row, report.token, **changes)
                written.append(ProgressWritten(report.id, refused))
        return written

    async def jobs_report_progress(
        self, reports: Sequence[ProgressReport]
    ) -> list[ProgressWritten]:
        return self.report_progress(reports)


def _as_postgres_text(value: Any) -> bytes:
    """A jsonb's text as PostgreSQL writes it (a space after each ':' and ','), in UTF-8: what
    jobs_report_progress measures."""
    return json.dumps(value, ensure_ascii=False).encode()


class ProgressLog:
    """What handlers reported here (a ProgressSink): `progress`, the last value (None: none);
    `values`, every progress value in order; `meta`, the updates merged. Each value is checked as
    a worker checks it (ProgressError in the handler) and kept as JSON gives it back. `write`:
    where each report goes too, at once (the Runner's store). Thread-safe: sync handlers run in
    threads."""

    def __init__(self, write: Callable[[ProgressReport], object] | None = None) -> None:
        self.progress: Any = None
        self.values: list[Any] = []
        self.meta: dict[str, Any] = {}
        self._write = write
        self._lock = threading.Lock()

    def set_progress(self, job: Job, value: Any) -> None:
        data = progress_json(value)
        with self._lock:
            self.progress = orjson.loads(data)
            self.values.append(orjson.loads(data))
        if self._write is not None:
            self._write(ProgressReport(job.id, job.token, job.bucket, data.decode(), None))

    def update_meta(self, job: Job, changes: Mapping[str, Any]) -> None:
        update = merged_meta(None, changes)
        with self._lock:
            self.meta = {**self.meta, **update}
        if self._write is not None:
            meta = orjson.dumps(update).decode()
            self._write(ProgressReport(job.id, job.token, job.bucket, None, meta))


@contextlib.contextmanager
def recorded_progress() -> Iterator[ProgressLog]:
    """What the handlers that `perform_job` runs inside report:

    with recorded_progress() as reported:
        perform_job(import_rows, "s3://bucket/rows.csv")
    assert reported.progress == 100 and reported.meta == {"rows": 1200}
    """
    log = ProgressLog()
    token = PROGRESS_SINK.set(log)
    try:
        yield log
    finally:
        PROGRESS_SINK.reset(token)


@contextlib.contextmanager
def reporting(sink: ProgressSink | None = None) -> Iterator[None]:
    """Handlers run inside may report: to `sink`, else to the sink already set here (by
    `recorded_progress`), else to a ProgressLog nobody reads."""
    if sink is None and PROGRESS_SINK.get() is not None:
        yield
        return
    token = PROGRESS_SINK.set(sink or ProgressLog())
    try:
        yield
    finally:
        PROGRESS_SINK.reset(token)
