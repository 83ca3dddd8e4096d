"""What running handlers report (`Job.set_progress`, `Job.update_meta`), coalesced in memory and
written in batches: the latest progress and the merged meta updates of each job, in one fenced
statement (jobs_report_progress) at most every DISPATCHER_PROGRESS_FLUSH_S, however often the
handlers report.

A job's last reports are written before its outcome: the completer calls `finishing` with the jobs
whose outcomes it is about to write (so a job's end never fences its own last report out). Reports
not written yet are lost if the worker dies: progress is a view of a running job, not its outcome.

`Coalescer` holds the reports (thread-safe: sync handlers report from their threads) and decides
when the next batch may go, on a clock that tests replace; `ProgressFlusher` is the worker's
service that writes them, and the sink (model.ProgressSink) the worker sets for its handlers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from dispatcher.db.periodic import PeriodicService
from dispatcher.db.progress import ProgressReport, ProgressWritten
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from dispatcher.job_reports import STORED_META_BYTES, merged_meta, progress_json
from dispatcher.model import Job
from dispatcher.observe import metrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Pending:
    """One job's reports not written yet: its latest progress (JSON) and its meta updates merged."""

    job: Job
    progress: bytes | None = None
    meta: dict[str, Any] | None = None

    def report(self) -> ProgressReport:
        job = self.job
        return ProgressReport(
            job.id,
            job.token,
            job.bucket,
            None if self.progress is None else self.progress.decode(),
            None if self.meta is None else orjson.dumps(self.meta).decode(),
        )


class Coalescer:
    """The reports of running jobs, one entry per job with the latest of each: a handler that
    reports a thousand times between two batches costs one row of one statement. `take` gives a
    batch at most once per `flush_s` of `clock`; `take_jobs` gives finishing jobs' at once."""

    def __init__(self, flush_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._flush_s = flush_s
        self._clock = clock
        self._pending: dict[int, Pending] = {}
        self._lock = threading.Lock()
        self._last_batch: float | None = None  # the clock's time `take` last gave a batch

    def set_progress(self, job: Job, value: Any) -> None:
        data = progress_json(value)  # ProgressError in the handler, before anything is kept
        with self._lock:
            self._entry(job).progress = data

    def update_meta(self, job: Job, changes: Mapping[str, Any]) -> None:
        with self._lock:
            entry = self._pending.get(job.id)
            ours = entry.meta if entry is not None and entry.job.token == job.token else None
            self._entry(job).meta = merged_meta(ours, changes)  # ProgressError: nothing kept

    def _entry(self, job: Job) -> Pending:
        entry = self._pending.get(job.id)
        if entry is None or entry.job.token != job.token:  # a new claim's: the old one's are moot
            entry = self._pending[job.id] = Pending(job)
        return entry

    @property
    def pending(self) -> int:
        """Jobs with reports not written yet."""
        return len(self._pending)

    def take(self) -> list[Pending]:
        """Every job's pending reports, if `flush_s` has passed since the last batch; else none."""
        now = self._clock()
        with self._lock:
            if not self._pending or (
                self._last_batch is not None and now - self._last_batch < self._flush_s
            ):
                return []
            batch, self._pending = list(self._pending.values()), {}
            self._last_batch = now
        return batch

    def take_jobs(self, ids: Iterable[int]) -> list[Pending]:
        """The pending reports of `ids`, whose outcomes are about to be written: now, whatever
        the interval (one statement per flush of outcomes, and only while some job reported)."""
        if not self._pending:  # the common case: one read, no lock
            return []
        with self._lock:
            pending = self._pending
            return [pending.pop(i) for i in ids if i in pending]

    def put_back(self, batch: Iterable[Pending]) -> None:
        """A batch that was not written: kept for the next one, under what was reported since."""
        with self._lock:
            for old in batch:
                newer = self._pending.get(old.job.id)
                if newer is None:
                    self._pending[old.job.id] = old
                elif newer.job.token == old.job.token:
                    newer.progress = newer.progress if newer.progress is not None else old.progress
                    if old.meta is not None:
                        newer.meta = {**old.meta, **(newer.meta or {})}


@dataclass(slots=True)
class ProgressStats:
    writes: int = 0  # batched writes (one statement; on a Citus cluster, one per bucket)
    written: int = 0  # jobs whose reports were written
    fenced: int = 0  # jobs no longer running under the reporting claim: nothing written
    meta_refused: int = 0  # meta merges refused: the job's meta would have grown too big


class ProgressFlusher(PeriodicService):
    """The worker's progress writer: a batch every `flush_s` when handlers reported, on the
    completions' connection (short owner-fenced writes, as heartbeats are)."""

    name = "progress"

    def __init__(
        self, store: JobStore, flush_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(store, flush_s, first_delay_s=flush_s, clock=clock)
        self.coalescer = Coalescer(flush_s, clock)
        self.stats = ProgressStats()
        self._writing = asyncio.Lock()  # one write at a time: a job's reports land in order

    # The sink of the worker's handlers (model.ProgressSink).
    def set_progress(self, job: Job, value: Any) -> None:
        self.coalescer.set_progress(job, value)

    def update_meta(self, job: Job, changes: Mapping[str, Any]) -> None:
        self.coalescer.update_meta(job, changes)

    async def tick(self) -> float:
        batch = self.coalescer.take()
        if batch:
            await self._write(batch)  # a StoreError: counted and logged by run(), batch kept
        return self.interval_s

    async def finishing(self, ids: Iterable[int]) -> None:
        """The outcomes of `ids` are about to be written: their reports first. Never raises a
        StoreError: a report that cannot be written now does not hold up the outcome (it is
        tried again with the next batch, then fenced if its job has ended)."""
        batch = self.coalescer.take_jobs(ids)
        if not batch:
            return
        try:
            await self._write(batch)
        except StoreError as exc:
            metrics.STORE_ERRORS.labels(self.name).inc()
            log.warning(
                "could not write the last progress of %d finishing jobs: %s", len(batch), exc
            )

    async def _write(self, batch: list[Pending]) -> None:
        async with self._writing:
            try:
                written = await self._store.jobs_report_progress([p.report() for p in batch])
            except BaseException:  # a store error, or a shutdown: the next batch takes them
                self.coalescer.put_back(batch)
                raise
        self._count(batch, written)

    def _count(self, batch: list[Pending], written: list[ProgressWritten]) -> None:
        stats = self.stats
        stats.writes += 1
        stats.written += len(written)
        stats.fenced += len(batch) - len(written)
        metrics.PROGRESS_WRITES.inc()
        refused = [w.id for w in written if w.meta_refused]
        if refused:
            stats.meta_refused += len(refused)
            log.warning(
                "metadata of %d jobs not merged: their meta would grow past %d bytes as JSON "
                "(Job.update_meta adds keys without bound?); ids %s",
                len(refused),
                STORED_META_BYTES,
                refused[:20],
                extra={"job_ids": refused[:20]},
            )
