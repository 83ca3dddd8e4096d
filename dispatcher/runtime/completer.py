"""Batched completion: finished jobs are written in one statement per flush.

A flush every `flush_interval_s` or at `flush_max` pending outcomes; each row is fenced by its
claim's token (a taken-over row is counted as fenced, never an error). An attempt gets its
history row and its outcome count only once its write was accepted: the statements answer which
were refused. A failed write keeps its outcomes and retries. Why batches: docs/design/worker.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Set
from dataclasses import dataclass
from typing import Any, Protocol

from dispatcher.backoff import jittered
from dispatcher.constants import LIMIT_ANY as ANY_TYPE
from dispatcher.db.handbacks import HandBack, hand_back
from dispatcher.db.rows import Chain, FailedWrite, Failure, HistoryRows
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from dispatcher.model import (
    STATUS_CANCELLED,
    STATUS_DISCARDED,
    STATUS_FAILED,
    STATUS_QUEUED,
    FailureKind,
    Job,
    Outcome,
)
from dispatcher.observe import metrics
from dispatcher.observe.job_metrics import JOB_STATS, JobStats
from dispatcher.runtime import joblog, unserved
from dispatcher.runtime.results import encode_result
from dispatcher.settings.sections import CompletionSettings

log = logging.getLogger(__name__)

# A failed attempt's outcome word, by the status written (jobs_fail_owned's rows): in the history
# rows and in dispatcher_job_outcomes_total. (A cancelled attempt, once cancelling exists, adds its
# own.)
_HISTORY_OUTCOME = {
    STATUS_QUEUED: "retried",
    STATUS_FAILED: "failed",
    STATUS_DISCARDED: "discarded",
}

# An operator's cancel is an outcome of its own: in the history rows, and the outcome label of
# dispatcher_job_outcomes_total{outcome="cancelled"} wherever outcomes are counted by this word.
_HISTORY_OUTCOME[STATUS_CANCELLED] = "cancelled"
# a `raise Snooze(s)` within DISPATCHER_MAX_SNOOZES: queued again, its attempt given back
SNOOZED = "snoozed"


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
    snoozed: int = 0
    fenced: int = 0
    flushes: int = 0


class Completer:
    def __init__(
        self,
        store: JobStore,
        settings: CompletionSettings,
        *,
        chaining: ChainSlots | None = None,
        urgent_types: Set[str] = frozenset(),
        written: Callable[[], None] | None = None,
        job_stats: JobStats = JOB_STATS,
        unserved_window_s: float = 3600.0,
    ) -> None:
        """`chaining`: where keyed completions claim their keys' next jobs (partitioned mode);
        `urgent_types`: the job types whose outcomes are written at once, a view that flow control
        keeps current; `written`: told after each flush that wrote something."""
        self.store = store
        # run time and outcome of every finished attempt (job_metrics.py)
        self._job_stats = job_stats
        self._interval_s = settings.flush_interval_s
        self._flush_max = settings.flush_max
        self._history_on = settings.history
        self._ids: list[int] = []
        self._tokens: list[str] = []
        # The completed jobs and their run times, counted once their write is accepted.
        self._done: list[Job] = []
        self._durations_s: list[float] = []
        self._keyed = False  # some pending completion has an ordering key: flush at once, promoting
        self._results: dict[int, Any] = {}  # pending completions' return values, by job id
        self._max_result_bytes = settings.max_result_bytes
        self._failures: list[Failure] = []
        # jobs of a type without a handler here, handed back (runtime/unserved.py)
        self._hand_backs: list[HandBack] = []
        self.unserved_window_s = unserved_window_s
        self._history = HistoryRows()
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()  # one flush at a time: the run loop and a shutdown flush
        self.stats = CompletionStats()
        # Partitioned mode: keyed completions claim their keys' next jobs for us (chaining.py).
        self.chaining = chaining
        # Job types under a fleet-wide max_running ('*': any): their outcomes are written at once,
        # since a gated claim waits for the slot (flow_control.py); and who to tell once written.
        # A live view (FlowControl.urgent_types), read per job as a plain attribute: no call.
        self.urgent_types = urgent_types
        self.written = written
        # Told the ids whose outcomes a flush is about to write, first: their last progress
        # reports go before them (runtime/progress.py).
        self.before_write: Callable[[Iterable[int]], Awaitable[None]] | None = None

    # Hot path: four appends and a length check per job; its metrics and history row (+0.27 us:
    # docs/design/health-and-metrics.md) once the flush's write accepted it.
    def completed(self, job: Job, duration_s: float, result: Any = None) -> None:
        """`result`: the handler's return value, stored with the job (None: nothing to store)."""
        if result is not None:
            self._results[job.id] = result
        self._ids.append(job.id)
        self._tokens.append(job.token)
        self._done.append(job)
        self._durations_s.append(duration_s)
        if job.ordering_key is not None:
            # The key's next job waits for this write: flush now, not at the interval (a flush in
            # flight meanwhile batches whatever finishes while it runs).
            self._keyed = True
            self._full.set()
        elif self.urgent_types and (
            job.job_type in self.urgent_types or ANY_TYPE in self.urgent_types
        ):
            self._full.set()
        if len(self._ids) >= self._flush_max:
            self._full.set()

    def failed(
        self,
        job: Job,
        outcome: Outcome,
        duration_s: float,
        *,
        kind: FailureKind = FailureKind.ERROR,
        summary: str | None = None,
        halts: bool = True,
        snooze: tuple[float, int] | None = None,
    ) -> None:
        """A failed attempt; `kind` and `summary` (the error in one line) are for its log line;
        `halts`: a final failure of a keyed job halts its key (the handler's on_ordered_failure);
        `snooze`: (seconds, cap) of a Snooze, written as `outcome` only past the cap
        (rows.Failure)."""
        self._failures.append(
            Failure(job.id, job.token, outcome, job, kind, summary, halts, snooze, duration_s)
        )
        if job.ordering_key is not None or (
            self.urgent_types
            and (job.job_type in self.urgent_types or ANY_TYPE in self.urgent_types)
        ):
            self._full.set()
        if len(self._failures) >= self._flush_max:
            self._full.set()

    def handed_back(self, back: HandBack) -> None:
        """A job whose type has no handler here, handed back: written at once (rare, and the job
        should reach a worker that serves its type soon)."""
        self._hand_backs.append(back)
        self._full.set()

    @property
    def pending(self) -> int:
        return len(self._ids) + len(self._failures) + len(self._hand_backs)

    async def run(self) -> None:
        """Flush forever; cancelled by the worker, which then calls `flush()` itself, shielded."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), timeout=self._interval_s)
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
                # Outcomes stay buffered (see flush); back off briefly so a down database is not
                # hammered.
                log.warning("completion flush failed, will retry: %s", exc)
                await asyncio.sleep(jittered(min(1.0, self._interval_s * 10)))

    async def flush(self) -> None:
        """Write everything pending. On a store error, what was not written is put back and it
        raises."""
        async with self._lock:
            if not self._ids and not self._failures and not self._history and not self._hand_backs:
                return
            started = time.perf_counter()
            ids, tokens, self._ids, self._tokens = self._ids, self._tokens, [], []
            done, durations_s, self._done, self._durations_s = self._done, self._durations_s, [], []
            keyed, self._keyed = self._keyed, False
            results, self._results = self._results, {}
            failures, self._failures = self._failures, []
            backs, self._hand_backs = self._hand_backs, []
            history, self._history = self._history, HistoryRows()
            try:
                if self.before_write is not None:
                    await self.before_write(itertools.chain(ids, (f.id for f in failures)))
                if ids:
                    # Each job's bucket: a distributed table routes the write by it.
                    buckets = [job.bucket for job in done]
                    if results:
                        fenced = await self._complete_with_results(
                            ids, tokens, buckets, keyed, results
                        )
                    elif keyed and self.chaining is not None:
                        fenced = await self._complete_chained(ids, tokens, buckets, self.chaining)
                    else:
                        completion = await self.store.jobs_complete(
                            ids, tokens, keyed=keyed, buckets=buckets
                        )
                        fenced = completion.fenced
                    ids, tokens = [], []  # written: nothing to put back
                    self._record_completed(done, durations_s, fenced, history)
                    done, durations_s = [], []
                if failures:
                    rows = await self.store.jobs_fail_owned(failures)
                    written, failures = failures, []
                    self._record_failures(written, rows, history)
                    # once written: the lines say what the rows hold
                    joblog.failures_written(written, rows)
                if backs:
                    handed = await hand_back(self.store, backs, self.unserved_window_s)
                    backs = []
                    unserved.written(handed)
                if history:
                    await self.store.history_record(history)
            # a store error, or a cancelled final flush: keep the count right
            except BaseException as exc:
                if isinstance(exc, StoreError):
                    metrics.STORE_ERRORS.labels("flush").inc()
                self._ids[:0], self._tokens[:0] = ids, tokens
                self._done[:0], self._durations_s[:0] = done, durations_s
                self._keyed = self._keyed or (keyed and bool(ids))
                if ids:
                    self._results.update(results)
                self._failures[:0] = failures
                self._hand_backs[:0] = backs
                history.extend(self._history)
                self._history = history
                raise
            self.stats.flushes += 1
            metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)
        if self.written is not None:
            self.written()

    async def _complete_with_results(
        self,
        ids: list[int],
        tokens: list[str],
        buckets: list[int],
        keyed: bool,
        results: dict[int, Any],
    ) -> list[int]:
        """Jobs that returned a value are completed with it (their rows are kept, whatever
        DISPATCHER_COMPLETED_JOBS says: the result is read from there); the others as usual."""
        plain = [n for n, job_id in enumerate(ids) if job_id not in results]
        valued = [n for n, job_id in enumerate(ids) if job_id in results]
        fenced: list[int] = []
        if plain:
            done = await self.store.jobs_complete(
                [ids[n] for n in plain],
                [tokens[n] for n in plain],
                keyed=keyed,
                buckets=[buckets[n] for n in plain],
            )
            fenced += done.fenced
        encoded = [encode_result(ids[n], results[ids[n]], self._max_result_bytes) for n in valued]
        done = await self.store.jobs_complete(
            [ids[n] for n in valued],
            [tokens[n] for n in valued],
            keyed=keyed,
            buckets=[buckets[n] for n in valued],
            results=encoded,
        )
        return fenced + done.fenced

    async def _complete_chained(
        self, ids: list[int], tokens: list[str], buckets: list[int], chaining: ChainSlots
    ) -> list[int]:
        chain = chaining.reserve()
        sent_at = time.monotonic()
        try:
            done = await self.store.jobs_complete(
                ids, tokens, keyed=True, buckets=buckets, chain=chain
            )
        except BaseException:
            chaining.settle(chain, [], sent_at)
            raise
        chaining.settle(chain, done.claimed, sent_at)
        return done.fenced

    def _record_completed(
        self, jobs: list[Job], durations_s: list[float], fenced: list[int], history: HistoryRows
    ) -> None:
        """Metrics and history rows of the completions whose write was accepted (not `fenced`)."""
        written = len(jobs) - len(fenced)
        self.stats.completed += written
        metrics.JOBS_COMPLETED.inc(written)
        refused = set(fenced)  # empty but for a taken-over job
        finished, history_on, worker = (
            self._job_stats.finished,
            self._history_on,
            self.store.worker_id,
        )
        for job, duration_s in zip(jobs, durations_s, strict=True):
            if refused and job.id in refused:
                continue
            finished(job.queue, job.job_type, "completed", duration_s)
            if history_on:
                history.add(
                    job.id,
                    job.attempts,
                    worker,
                    job.locked_at,
                    duration_s * 1000.0,
                    "completed",
                    None,
                )
        if fenced:
            self._count_fenced(len(fenced), "completions")

    def _record_failures(
        self, failures: list[Failure], rows: list[FailedWrite], history: HistoryRows
    ) -> None:
        """Outcome counts and history rows of the failures written (`rows`), by the status written:
        a retry the database turned into a cancel (its request newer than our last heartbeat) is a
        cancel, a snooze past DISPATCHER_MAX_SNOOZES the failed attempt it became."""
        by_id = {f.id: f for f in failures}
        counts = dict.fromkeys((*_HISTORY_OUTCOME.values(), SNOOZED), 0)
        for row in rows:
            failure = by_id[row.id]
            outcome = SNOOZED if row.snoozed else _HISTORY_OUTCOME[row.status]
            counts[outcome] += 1
            job = failure.job
            if job is None:
                continue
            self._job_stats.finished(job.queue, job.job_type, outcome, failure.duration_s)
            if self._history_on:
                error = failure.summary if row.snoozed else failure.outcome.error
                history.add(
                    job.id,
                    job.attempts,
                    self.store.worker_id,
                    job.locked_at,
                    failure.duration_s * 1000.0,
                    outcome,
                    error,
                )
        stats = self.stats
        stats.retried += counts["retried"]
        stats.failed += counts["failed"]
        stats.discarded += counts["discarded"]
        stats.cancelled += counts["cancelled"]
        stats.snoozed += counts[SNOOZED]
        metrics.JOBS_RETRIED.inc(counts["retried"])
        metrics.JOBS_FAILED.inc(counts["failed"])
        metrics.JOBS_DISCARDED.inc(counts["discarded"])
        if len(rows) < len(failures):
            self._count_fenced(len(failures) - len(rows), "failures")

    def _count_fenced(self, n: int, what: str) -> None:
        self.stats.fenced += n
        metrics.JOBS_FENCED.inc(n)
        log.info("%d %s fenced: those jobs' leases were taken over by another owner", n, what)
