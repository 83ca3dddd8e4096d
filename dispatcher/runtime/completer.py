"""Batched completion: finished jobs are written in one statement per flush.

A flush every `flush_interval_s` or at `flush_max` pending outcomes; each row is fenced by its
claim's token (a taken-over row is counted as fenced, never an error). A failed write keeps its
outcomes and retries. Why batches: docs/design/worker.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from dispatcher.backoff import jittered
from dispatcher.db.rows import Chain, Failure, HistoryRows
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from dispatcher.model import STATUS_CANCELLED, STATUS_DISCARDED, STATUS_FAILED, STATUS_QUEUED, FailureKind, Job, Outcome
from dispatcher.observe import metrics
from dispatcher.observe.job_metrics import JOB_STATS, JobStats
from dispatcher.runtime import joblog
from dispatcher.settings.sections import CompletionSettings

log = logging.getLogger(__name__)

# A failed attempt's outcome word, by the status it was decided to end in: in the history rows and
# in dispatcher_job_outcomes_total. (A cancelled attempt, once cancelling exists, adds its own.)
_HISTORY_OUTCOME = {STATUS_QUEUED: "retried", STATUS_FAILED: "failed", STATUS_DISCARDED: "discarded"}

# An operator's cancel is an outcome of its own: in the history rows, and the outcome label of
# dispatcher_job_outcomes_total{outcome="cancelled"} wherever outcomes are counted by this word.
_HISTORY_OUTCOME[STATUS_CANCELLED] = "cancelled"


class ChainSlots(Protocol):
    """Where a keyed completion's chained claims go (dispatcher/runtime/chaining.py)."""

    def reserve(self) -> Chain: ...

    def settle(self, chain: Chain, jobs: list[Job], sent_at: float) -> None: ...


@dataclass(slots=True)
class CompletionStats:
    completed: int = 0
    retried: int = 0
    failed: int = 0
    discarded: int = 0
    cancelled: int = 0
    fenced: int = 0
    flushes: int = 0


class Completer:
    def __init__(self, store: JobStore, settings: CompletionSettings, *, job_stats: JobStats = JOB_STATS) -> None:
        self.store = store
        self._job_stats = job_stats  # run time and outcome of every finished attempt (job_metrics.py)
        self._interval_s = settings.flush_interval_s
        self._flush_max = settings.flush_max
        self._history_on = settings.history
        self._ids: list[int] = []
        self._tokens: list[str] = []
        self._keyed = False  # some pending completion has an ordering key: flush at once, promoting
        self._failures: list[Failure] = []
        self._history = HistoryRows()
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()  # one flush at a time: the run loop and a shutdown flush
        self.stats = CompletionStats()
        # Partitioned mode: keyed completions claim their keys' next jobs for us (chaining.py).
        self.chaining: ChainSlots | None = None

    # Hot path: two appends, the job's metrics (+0.27 us: docs/design/health-and-metrics.md) and a length check per job.
    def completed(self, job: Job, duration_s: float) -> None:
        self._ids.append(job.id)
        self._tokens.append(job.token)
        if job.ordering_key is not None:
            # The key's next job waits for this write: flush now, not at the interval (a flush in
            # flight meanwhile batches whatever finishes while it runs).
            self._keyed = True
            self._full.set()
        self._job_stats.finished(job.job_type, "completed", duration_s)
        if self._history_on:
            self._history.add(job.id, job.attempts, self.store.worker_id, job.locked_at, duration_s * 1000.0,
                              "completed", None)
        if len(self._ids) >= self._flush_max:
            self._full.set()

    def failed(self, job: Job, outcome: Outcome, duration_s: float, *, kind: FailureKind = FailureKind.ERROR,
               summary: str | None = None, halts: bool = True) -> None:
        """A failed attempt; `kind` and `summary` (the error in one line) are for its log line;
        `halts`: a final failure of a keyed job halts its key (the handler's on_ordered_failure)."""
        self._failures.append(Failure(job.id, job.token, outcome, job, kind, summary, halts))
        if job.ordering_key is not None:
            self._full.set()
        self._job_stats.finished(job.job_type, _HISTORY_OUTCOME[outcome.status], duration_s)
        if self._history_on:
            self._history.add(job.id, job.attempts, self.store.worker_id, job.locked_at, duration_s * 1000.0,
                              _HISTORY_OUTCOME[outcome.status], outcome.error)
        if len(self._failures) >= self._flush_max:
            self._full.set()

    @property
    def pending(self) -> int:
        return len(self._ids) + len(self._failures)

    async def run(self) -> None:
        """Flush forever; cancelled by the worker, which then calls `flush()` itself, shielded."""
        while True:
            try:
                await asyncio.wait_for(self._full.wait(), timeout=self._interval_s)
            except TimeoutError:
                pass
            self._full.clear()
            flush = asyncio.ensure_future(self.flush())
            try:
                # Shielded: when the worker cancels this loop at shutdown, a flush in flight
                # still completes (or puts its outcomes back); the worker's final flush then
                # waits for it on the lock and writes whatever is left, and reports any failure.
                await asyncio.shield(flush)
            except asyncio.CancelledError:
                # Its error is the final flush's to report: mark it retrieved, or asyncio logs it.
                flush.add_done_callback(lambda f: f.cancelled() or f.exception())
                raise
            except StoreError as exc:
                # Outcomes stay buffered (see flush); back off briefly so a down database is not hammered.
                log.warning("completion flush failed, will retry: %s", exc)
                await asyncio.sleep(jittered(min(1.0, self._interval_s * 10)))

    async def flush(self) -> None:
        """Write everything pending. On a store error, what was not written is put back and it raises."""
        async with self._lock:
            if not self._ids and not self._failures and not self._history:
                return
            started = time.perf_counter()
            ids, tokens, self._ids, self._tokens = self._ids, self._tokens, [], []
            keyed, self._keyed = self._keyed, False
            failures, self._failures = self._failures, []
            history, self._history = self._history, HistoryRows()
            try:
                if ids:
                    if keyed and self.chaining is not None:
                        written = await self._complete_chained(ids, tokens, self.chaining)
                    else:
                        written = await self.store.jobs_complete_owned(ids, tokens, keyed=keyed)
                    self._count_completed(len(ids), written)
                    ids = tokens = []  # written: nothing to put back
                if failures:
                    rows = await self.store.jobs_fail_owned(failures)
                    self._count_failures(failures, len(rows))
                    written, failures = failures, []
                    joblog.failures_written(written, rows)  # once written: the lines say what the rows hold
                if history:
                    await self.store.history_record(history)
            except BaseException as exc:  # a store error, or a cancelled final flush: keep the count right
                if isinstance(exc, StoreError):
                    metrics.STORE_ERRORS.labels("flush").inc()
                self._ids[:0], self._tokens[:0] = ids, tokens
                self._keyed = self._keyed or (keyed and bool(ids))
                self._failures[:0] = failures
                history.extend(self._history)
                self._history = history
                raise
            self.stats.flushes += 1
            metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)

    async def _complete_chained(self, ids: list[int], tokens: list[str], chaining: ChainSlots) -> int:
        chain = chaining.reserve()
        sent_at = time.monotonic()
        try:
            done = await self.store.jobs_complete_keyed(ids, tokens, chain)
        except BaseException:
            chaining.settle(chain, [], sent_at)
            raise
        chaining.settle(chain, done.claimed, sent_at)
        return int(done.completed)

    def _count_completed(self, sent: int, written: int) -> None:
        self.stats.completed += written
        metrics.JOBS_COMPLETED.inc(written)
        if written < sent:
            self._count_fenced(sent - written, "completions")

    def _count_failures(self, failures: list[Failure], written: int) -> None:
        # Counted by intent; if some rows were fenced the per-status split is approximate, the
        # fenced count exact.
        retried = sum(f.outcome.status == STATUS_QUEUED for f in failures)
        failed = sum(f.outcome.status == STATUS_FAILED for f in failures)
        # An operator's cancel: the hook for dispatcher_job_outcomes_total{outcome="cancelled"}. (A
        # retry that the database turned into a cancel, its request too recent for our last
        # heartbeat, is counted as the retry we decided: jobs_fail_owned.)
        cancelled = sum(f.outcome.status == STATUS_CANCELLED for f in failures)
        discarded = len(failures) - retried - failed - cancelled
        self.stats.retried += retried
        self.stats.failed += failed
        self.stats.discarded += discarded
        self.stats.cancelled += cancelled
        metrics.JOBS_RETRIED.inc(retried)
        metrics.JOBS_FAILED.inc(failed)
        metrics.JOBS_DISCARDED.inc(discarded)
        if written < len(failures):
            self._count_fenced(len(failures) - written, "failures")

    def _count_fenced(self, n: int, what: str) -> None:
        self.stats.fenced += n
        metrics.JOBS_FENCED.inc(n)
        log.info("%d %s fenced: those jobs' leases were taken over by another owner", n, what)
