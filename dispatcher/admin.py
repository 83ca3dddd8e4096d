"""The operator's API, `dispatcher.admin`: list, search, show, retry, cancel and purge jobs
(`dispatcher jobs` and the dashboard use it), with its typed results (api/admin_results.py); the
fleet's flow control and the schedules listing are re-exported. Sync psycopg, on a DSN or an idle
connection; every write re-checks the row's status. Usage: docs/guides/admin.md; why it works
so: docs/design/admin.md.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import psycopg

from coordinator.pg.connect import ConnectionLimits
from dispatcher.api.admin_results import (  # re-exported: what the admin returns
    AdminResult,
    Attempt,
    HaltedKey,
    JobDetail,
    JobRow,
    Match,
    SearchPage,
    Skipped,
)
from dispatcher.api.flow import (  # re-exported: the fleet's flow control
    LimitRow,
    PausedQueue,
    clear_limits,
    list_limits,
    pause_queue,
    paused_queues,
    resume_queue,
    set_limit,
)
from dispatcher.api.job_filters import (  # Filters, the search forms: re-exported
    ELIGIBLE,
    HALTING,
    Filters,
    id_list,
    payload_filter,
)
from dispatcher.api.schedules.listing import ScheduleRow, list_schedules  # re-exported
from dispatcher.constants import NOTIFY_CHANNEL
from dispatcher.db import rows, sharded_admin
from dispatcher.db.citus import hash_distributed
from dispatcher.db.dependencies import release_rounds
from dispatcher.db.oneshot import bounded_transaction, session
from dispatcher.db.queries import query
from dispatcher.db.rows import WrittenJob
from dispatcher.errors import AdminInputError, StoreError, StoreTimeout
from dispatcher.model import (
    STATUS_CANCELLED,
    STATUS_RUNNING,
    STATUS_WAITING,
)

# statement timeout = statement_timeout_s x this (30 s at the defaults), as maintenance's
ADMIN_BUDGET = 6.0
DEFAULT_BATCH = 1000  # rows per statement of a bulk change: ~2 ms each, 1,000 row locks at most
DEFAULT_LIST_LIMIT = 50
MAX_REPORTED_IDS = 100_000  # ids of changed jobs kept in a result; the counts are always exact
SEARCH_WINDOW_IDS = 100_000  # ids one page of search_jobs examines at most
# a batch that hit a dedupe key enqueued meanwhile is sent again (it is then skipped)
_UNIQUE_RETRIES = 3

Target = str | psycopg.Connection[Any]
# One batch of a change: write(ids, filters, result) (_write, or _write_by_bucket on Citus).
_Write = Callable[[list[int], Filters, AdminResult], None]


def list_jobs(
    target: Target,
    filters: Filters = Filters(),
    *,
    limit: int = DEFAULT_LIST_LIMIT,
    limits: ConnectionLimits | None = None,
) -> list[JobRow]:
    """Jobs that match, newest first, at most `limit`."""
    _whole(limit, "limit")
    with _session(target, limits) as run:
        found = run("list", _sql("admin_jobs_list"), {**filters.params(), "limit": limit})
    return rows.typed(JobRow, found)


def search_jobs(
    target: Target,
    filters: Filters,
    *,
    limit: int = DEFAULT_LIST_LIMIT,
    window: int = SEARCH_WINDOW_IDS,
    limits: ConnectionLimits | None = None,
) -> SearchPage:
    """list_jobs within one window of ids: at most `window` ids below filters.before_id (none:
    the newest job's and below), walked newest first on the primary key. A search that no index
    serves (a payload, an error text) reads at most `window` rows a page, however rare its
    matches. Fewer than `limit` jobs: that is all the window holds; the next window is below
    its floor (before_id=floor)."""
    _whole(limit, "limit")
    _whole(window, "window")
    with _session(target, limits) as run:
        (ids,) = rows.typed(rows.JobIdRange, run("list", query("admin_jobs_id_range"), {}))
        ceiling = filters.before_id or (ids.newest or 0) + 1
        floor = max(1, ceiling - window, filters.min_id or 1)
        params = replace(filters, min_id=floor).params()
        found = run("list", _sql("admin_jobs_list"), {**params, "limit": limit})
    older = ids.lowest is not None and ids.lowest < floor
    return SearchPage(rows.typed(JobRow, found), floor, ceiling, older)


def list_halted_keys(
    target: Target,
    filters: Filters = Filters(),
    *,
    limit: int = DEFAULT_LIST_LIMIT,
    limits: ConnectionLimits | None = None,
) -> list[HaltedKey]:
    """Halted keys whose halted job matches, newest halt first (by its job's id), at most
    `limit`."""
    _whole(limit, "limit")
    with _session(target, limits) as run:
        found = run("list", _sql("admin_halted_keys"), {**filters.params(), "limit": limit})
    return rows.typed(HaltedKey, found)


def count_jobs(
    target: Target,
    filters: Filters,
    action: str | None = None,
    *,
    limits: ConnectionLimits | None = None,
) -> int:
    """How many jobs match (those `action` would touch, if given): what a bulk change asks to
    confirm."""
    return match_jobs(target, filters, action, limits=limits).count


def match_jobs(
    target: Target,
    filters: Filters,
    action: str | None = None,
    *,
    limits: ConnectionLimits | None = None,
) -> Match:
    """How many jobs match, the newest of them and the instant, read by one statement."""
    if action is not None:
        filters = filters.for_action(action)
    with _session(target, limits) as run:
        (match,) = rows.typed(
            rows.JobsMatch, run("count", _sql("admin_jobs_count"), filters.params())
        )
    return Match(int(match.matched), match.newest, match.as_of)


def show_job(
    target: Target,
    job_id: int,
    *,
    attempts_limit: int = 100,
    limits: ConnectionLimits | None = None,
) -> JobDetail | None:
    """The job's row, last error and attempt history (None: no such job)."""
    Filters(ids=(job_id,))  # validates the id
    with _session(target, limits) as run:
        shown = run("show", query("admin_job_show"), {"id": job_id}, as_dicts=True)
        if not shown:
            return None
        attempts = run("show", query("admin_job_attempts"), {"id": job_id, "limit": attempts_limit})
    (job,) = shown
    return JobDetail(job, job.get("last_error"), rows.typed(Attempt, attempts))


def job_attempts(
    target: Target, job_id: int, *, limit: int = 100, limits: ConnectionLimits | None = None
) -> list[Attempt]:
    """The job's attempt history alone, row or no row: what is left of a job whose row was
    deleted (completed under DISPATCHER_COMPLETED_JOBS=delete, pruned or purged), if
    DISPATCHER_HISTORY was on."""
    Filters(ids=(job_id,))  # validates the id
    with _session(target, limits) as run:
        found = run("show", query("admin_job_attempts"), {"id": job_id, "limit": limit})
    return rows.typed(Attempt, found)


def retry_jobs(
    target: Target,
    filters: Filters,
    *,
    batch: int = DEFAULT_BATCH,
    up_to_id: int | None = None,
    limits: ConnectionLimits | None = None,
    keep_going: Callable[[], bool] | None = None,
) -> AdminResult:
    """Failed or discarded jobs back to queued, due now; a keyed one that no longer holds its key
    waits, and runs next (see the module docstring)."""
    return _change("retry", target, filters, batch, up_to_id, limits, keep_going)


def cancel_jobs(
    target: Target,
    filters: Filters,
    *,
    batch: int = DEFAULT_BATCH,
    up_to_id: int | None = None,
    limits: ConnectionLimits | None = None,
    keep_going: Callable[[], bool] | None = None,
) -> AdminResult:
    """Queued and waiting jobs, and jobs that halt their key, cancelled at once; running ones get a
    cancel request (see the module docstring)."""
    return _change("cancel", target, filters, batch, up_to_id, limits, keep_going)


def purge_jobs(
    target: Target,
    filters: Filters,
    *,
    batch: int = DEFAULT_BATCH,
    up_to_id: int | None = None,
    limits: ConnectionLimits | None = None,
    keep_going: Callable[[], bool] | None = None,
) -> AdminResult:
    """Delete finished jobs that match (see the module docstring)."""
    return _change("purge", target, filters, batch, up_to_id, limits, keep_going)


# -- how a change runs -----------------------------------------------------------------------------


def _change(
    action: str,
    target: Target,
    filters: Filters,
    batch: int,
    up_to_id: int | None,
    limits: ConnectionLimits | None,
    keep_going: Callable[[], bool] | None = None,
) -> AdminResult:
    """With ids: those jobs (the filters must match too), each reported. Without: every job the
    filters match (narrowed to the statuses `action` applies to), batch by batch, up to `up_to_id`
    (default: the newest that matches now), while `keep_going()` says so before each batch."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
        raise AdminInputError(f"must be a whole number from 1 to 10000, got {batch!r}", "batch")
    result = AdminResult(action)
    sql = _sql(f"admin_jobs_{action}")
    with _session(target, limits) as run:
        if _distributed(run):  # Citus: bucket by bucket (db/sharded_admin.py)
            sql = sharded_admin.pin_write(sql)
            write: _Write = functools.partial(_write_by_bucket, run, action, sql)
        else:
            write = functools.partial(_write, run, action, sql)
        if filters.ids:
            ids = list(dict.fromkeys(filters.ids))
            result.matched = len(ids)
            for start in range(0, len(ids), batch):
                write(ids[start : start + batch], filters, result)
            return result
        narrowed = filters.for_action(action)
        if up_to_id is not None:  # counted, as walked, up to it
            bound = (
                up_to_id + 1
                if narrowed.before_id is None
                else min(up_to_id + 1, narrowed.before_id)
            )
            narrowed = replace(narrowed, before_id=bound)
        params = narrowed.params()
        (match,) = rows.typed(rows.JobsMatch, run("count", _sql("admin_jobs_count"), params))
        result.matched, last = int(match.matched), match.newest
        after = 0
        while last is not None and after < last:
            if keep_going is not None and not keep_going():
                result.finished = False
                break
            page = rows.values(
                run(
                    action,
                    _sql("admin_jobs_page"),
                    {**params, "after_id": after, "max_id": last, "limit": batch},
                )
            )
            if not page:
                break
            write(page, narrowed, result)
            after = page[-1]
            if len(page) < batch:
                break
    return result


def _write(
    run: Any, action: str, sql: str, ids: list[int], filters: Filters, result: AdminResult
) -> None:
    """One statement over `ids`: the change, re-checked on each row; the report of each id."""
    written = _statement(run, action, sql, {**filters.params(), "ids": ids})
    released = _report(action, written, result)
    if released:
        _promote(run, released)
    if action == "cancel":
        _release_children(run, [w.id for w in written if w.status == STATUS_CANCELLED])


def _release_children(run: Any, ids: list[int]) -> None:
    """The children of jobs cancelled at once follow their on_parent_failure (sql/deps.sql), the
    cancelled among them in turn (the sweeper goes on past CASCADE_ROUNDS)."""
    release_rounds(
        ids, lambda params: next(iter(run("release", query("deps_release"), params)), None)
    )


def _write_by_bucket(
    run: Any, action: str, sql: str, ids: list[int], filters: Filters, result: AdminResult
) -> None:
    """_write on a distributed jobs table: one statement per bucket of `ids` (`sql` pinned by
    sharded_admin.pin_write), each its own transaction, then the keys it released promoted in
    that bucket."""
    params = filters.params()
    (now,) = rows.values(run("clock", query("db_now"), {}))
    params.update(sharded_admin.clock_params(now, params))
    found = dict(run("buckets", query("sharded_admin_buckets_of"), {"ids": ids}))
    for bucket, some in sharded_admin.by_bucket(ids, found).items():
        written = _statement(run, action, sql, {**params, "ids": some, "bucket": bucket})
        released = _report(action, written, result)
        if released:
            _promote(run, released, bucket)
        if action == "cancel":
            _release_children(run, [w.id for w in written if w.status == STATUS_CANCELLED])


def _statement(run: Any, action: str, sql: str, params: dict[str, Any]) -> list[WrittenJob]:
    """The write, sent again when a job with the same dedupe key became live meanwhile."""
    for attempt in range(_UNIQUE_RETRIES):
        try:
            return rows.typed(WrittenJob, run(action, sql, params))
        except _DedupeRace:
            if attempt == _UNIQUE_RETRIES - 1:
                raise StoreError(
                    f"{action}: jobs with the same dedupe key kept being enqueued meanwhile; "
                    "run it again"
                ) from None
    raise AssertionError("unreachable")


def _report(action: str, written: list[WrittenJob], result: AdminResult) -> list[tuple[str, str]]:
    """Each id's outcome into `result`; the keys a changed row lets go on."""
    eligible = ELIGIBLE[action]
    after = {w.id: w.status for w in written if w.status is not None}  # the changed rows
    released = rows.released_keys(written, (STATUS_WAITING, STATUS_CANCELLED, "purged"))
    for w in written:
        if w.status is not None:
            continue  # the row as written; each id comes again below, as it was before
        if w.id not in after:
            why = _why(action, w.before, w.matches, w.dedupe_held, eligible, w.halted)
            result.skipped.append(Skipped(w.id, w.before, why))
        elif action == "cancel" and after[w.id] == STATUS_RUNNING:
            result.requested_count += 1
            _keep(result.requested, w.id)
        else:
            result.changed_count += 1
            _keep(result.changed, w.id)
    return released


def _promote(run: Any, keys: list[tuple[str, str]], bucket: int | None = None) -> None:
    """ordering_promote_keys after the change committed (on a distributed table: the keys of
    `bucket`, sharded_promote_keys, then a wake-up of its owners); a race with another promotion
    (a unique violation on the holder index) is tried again, a key still missed is left to the
    sweeper."""
    params: dict[str, Any] = {
        "queues": [q for q, _ in keys],
        "keys": [k for _, k in keys],
        "channel": NOTIFY_CHANNEL,
    }
    for _ in range(_UNIQUE_RETRIES):
        try:
            if bucket is None:
                run("promote", query("ordering_promote_keys"), params)
                return
            [(promoted, queues)] = run(
                "promote", query("sharded_promote_keys"), {**params, "bucket": bucket}
            )
            if promoted:
                wake = {"channel": NOTIFY_CHANNEL, "bucket": bucket, "queues": queues}
                run("promote", query("sharded_wake"), wake)
            return
        except _DedupeRace:
            continue


def _distributed(run: Any) -> bool:
    """Whether the jobs table is distributed (Citus), as distributed_sync reads it."""
    if not run("placement", query("citus_version"), {}):
        return False
    placement = run("placement", query("citus_distribution"), {})
    return hash_distributed(placement[0] if placement else None)


def _why(
    action: str,
    status: str | None,
    matches: bool,
    dedupe_held: bool,
    eligible: Sequence[str],
    halted: bool | None = None,
) -> str:
    if status is None:
        return "no such job"
    applies = ", ".join(eligible) + (
        " jobs and to jobs that halt their ordering key" if action == "cancel" else " jobs"
    )
    if action == "cancel" and status in HALTING and not halted:
        return f"it is {status} and does not halt its ordering key: cancel applies to {applies}"
    if status not in eligible and not (action == "cancel" and status in HALTING):
        return f"it is {status}: {action} applies to {applies}"
    if not matches:
        return "it does not match the filters"
    if dedupe_held:
        return "a live job holds its dedupe key"
    return "its status changed meanwhile"


def _whole(value: Any, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AdminInputError(f"must be a whole number >= 1, got {value!r}", option)


def _keep(ids: list[int], job_id: int) -> None:
    if len(ids) < MAX_REPORTED_IDS:
        ids.append(job_id)


class _DedupeRace(Exception):
    """A job with the same dedupe key became live between the check and the write."""


def _sql(name: str) -> str:
    return query(name).replace("{filters}", "(" + query("admin_filters") + ")")


@contextlib.contextmanager
def _session(target: Target, limits: ConnectionLimits | None) -> Iterator[Any]:
    """A `run(what, sql, params)` that executes one statement in its own bounded transaction on
    `target` (db/oneshot.py) and returns its rows (with `as_dicts=True`: as dicts by column)."""
    limits = limits or ConnectionLimits()

    def run(what: str, sql: str, params: dict[str, Any], as_dicts: bool = False) -> list[Any]:
        try:
            with bounded_transaction(conn, f"jobs {what}", limits, budget=ADMIN_BUDGET):
                try:
                    cur = conn.execute(sql, params, prepare=False)
                except psycopg.errors.UniqueViolation:
                    raise _DedupeRace() from None
                return rows.as_dicts(cur) if as_dicts else cur.fetchall()
        except StoreTimeout as exc:
            if exc.lock:
                raise
            raise StoreTimeout(
                f"{exc}; narrow the filters (a status, a queue), or raise "
                "DISPATCHER_STATEMENT_TIMEOUT_S",
                lock=False,
            ) from None

    if isinstance(target, str):
        with session(target, limits, application_name="dispatcher-admin") as conn:
            yield run
    else:
        conn = target
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise AdminInputError(
                "admin changes commit batch by batch: pass a connection that is not inside a "
                "transaction",
                "conn",
            )
        yield run


__all__ = [
    "AdminInputError",
    "AdminResult",
    "Attempt",
    "Filters",
    "HaltedKey",
    "JobDetail",
    "JobRow",
    "LimitRow",
    "Match",
    "PausedQueue",
    "ScheduleRow",
    "SearchPage",
    "Skipped",
    "cancel_jobs",
    "clear_limits",
    "count_jobs",
    "id_list",
    "job_attempts",
    "list_halted_keys",
    "list_jobs",
    "list_limits",
    "list_schedules",
    "match_jobs",
    "pause_queue",
    "paused_queues",
    "payload_filter",
    "purge_jobs",
    "resume_queue",
    "retry_jobs",
    "search_jobs",
    "set_limit",
    "show_job",
]
