"""DISPATCHER_COMPLETED_JOBS=archive against a real PostgreSQL: the completion that moves a job to
the time-partitioned archive in one fenced statement (its plan, its outcome with every feature
that reads a finished job), the readers that find archived jobs, the janitor's partitions (created
ahead, dropped past retention with no dead tuple, by a DML-only role), and a rolling upgrade from
a release that completes by UPDATE."""

import asyncio
import itertools
import json
from collections import Counter

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import sql

from dispatcher import (
    Config,
    Job,
    PermanentJobError,
    Registry,
    Worker,
    enqueue_payloads_sync,
    enqueue_sync,
)
from dispatcher.admin import Filters, cancel_jobs, list_jobs, purge_jobs, search_jobs, show_job
from dispatcher.db.completions import completion_statements
from dispatcher.db.migrate import migrate
from dispatcher.db.queries import query
from dispatcher.db.store import JobStore, int_array, token_array
from dispatcher.runtime import archive
from dispatcher.runtime.janitor import Pruner
from dispatcher.settings.sections import RetentionSettings
from tests.helpers import (
    fetchall,
    fetchval,
    plan_nodes,
    run_async,
    run_worker_until,
    status_counts,
    wait_until,
)
from tests.integration.test_privileges import dispatcher_cli, dml_role

ALL = tuple(range(64))
ARCHIVE = 20  # the migration that adds the archive
COLUMNS = """
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""


def _archived(dsn: str) -> dict[int, str]:
    return dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs_archive"))


def _range_partitions_dropped(dsn: str) -> None:
    """No range partition left: the template's (made by the migration when the session began)
    would be past this test's retention or behind its clock, depending on the suite's pace."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, _, to_at, _ in conn.execute(query("archive_partitions")).fetchall():
            if to_at is not None:
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


def _dead_tuples(dsn: str) -> int:
    """Dead tuples in the archive's range partitions, as the statistics say once flushed (the
    default partition's rows past retention are deleted, not dropped: it holds only what no range
    partition took)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        return int(
            conn.execute(
                "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
                "WHERE relname LIKE 'dispatcher_jobs_archive%%' "
                "AND relname <> 'dispatcher_jobs_archive_default'"
            ).fetchone()[0]
        )


def test_the_archive_has_the_jobs_columns_in_their_order_and_the_move_writes_every_one(dsn):
    """A migration that adds a column to the jobs table adds it to the archive too, and to the
    insert that moves a row (sql/archive.sql): else a column would be lost on the way."""
    jobs = fetchall(dsn, COLUMNS, ("dispatcher_jobs",))
    assert fetchall(dsn, COLUMNS, ("dispatcher_jobs_archive",)) == jobs
    insert = query("jobs_archive_insert")
    listed = (
        insert.split("INSERT INTO dispatcher_jobs_archive", 1)[1].split("(", 1)[1].split(")")[0]
    )
    assert [c.strip() for c in listed.split(",")] == [name for name, _ in jobs]


def test_the_archiving_completion_deletes_by_primary_key_and_inserts_in_one_statement(dsn):
    """The plan of the fenced completion under archive: the batch by primary key (no walk of
    the running rows), one DELETE and one INSERT, every row moved."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{"n": i} for i in range(50_000)])  # and ANALYZEs

    async def claim():
        store = JobStore(dsn, "w", completed_jobs="archive")
        try:
            return (await store.jobs_claim("default", 500, 30, ALL)).jobs
        finally:
            await store.close()

    jobs = run_async(claim())
    params = {
        "ids": int_array([j.id for j in jobs]),
        "tokens": token_array([j.token for j in jobs]),
        "results_channel": "test",
    }
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction(force_rollback=True):
        sql = completion_statements("archive")[False]
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0][0]
        moved = conn.execute("SELECT count(*) FROM dispatcher_jobs_archive").fetchone()[0]
    nodes = list(plan_nodes(plan["Plan"]))
    # The batch by primary key; the windows to close through the running-with-a-window index.
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], json.dumps(plan)[:2000]
    indexes = {n.get("Index Name") for n in nodes if "Index" in n["Node Type"]}
    assert indexes == {"dispatcher_jobs_pkey", "dispatcher_jobs_windowed_running_idx"} | (
        indexes & {"dispatcher_dedupe_windows_job_idx"}
    ), json.dumps(plan)[:2000]
    assert sorted(
        (n["Operation"], n["Relation Name"]) for n in nodes if n["Node Type"] == "ModifyTable"
    ) == [
        ("Delete", "dispatcher_jobs"),
        ("Insert", "dispatcher_jobs_archive"),
        ("Update", "dispatcher_dedupe_windows"),
    ]
    assert moved == 500


def test_a_worker_under_archive_moves_every_success_and_keeps_every_other_end(dsn):
    """Only a success moves: a retried job is a queued row until it succeeds; failed, discarded
    and cancelled ones stay in the jobs table, where retry acts on them. What read completed rows
    reads them in the archive: show, list, search, a result, an ordering key's next job, a
    uniqueness window, the history."""
    registry = Registry()
    tries: dict[int, int] = {}

    @registry.handler("ok")
    async def ok(job: Job) -> None:
        return None

    @registry.handler("answer")
    async def answer(job: Job) -> dict[str, int]:
        return {"n": job.payload["n"] * 2}

    @registry.handler("flaky")
    async def flaky(job: Job) -> None:
        tries[job.id] = tries.get(job.id, 0) + 1
        if tries[job.id] == 1:
            raise RuntimeError("first attempt fails")

    @registry.handler("doomed")
    async def doomed(job: Job) -> None:
        raise PermanentJobError("never")

    with psycopg.connect(dsn, autocommit=True) as conn:
        ok_ids = [int(enqueue_sync(conn, "ok", {"order": i})) for i in range(100)]
        keyed = [int(enqueue_sync(conn, "ok", {"k": i}, ordering_key="acct-1")) for i in range(5)]
        windowed = int(enqueue_sync(conn, "ok", {}, dedupe_key="nightly", dedupe_window_s=3600))
        answer_id = enqueue_sync(conn, "answer", {"n": 21})
        flaky_id = int(enqueue_sync(conn, "flaky", {}))
        doomed_id = int(enqueue_sync(conn, "doomed", {}))
        cancelled_id = int(enqueue_sync(conn, "ok", {}, delay_s=3600))
    assert answer_id is not None
    assert cancel_jobs(dsn, Filters(ids=(cancelled_id,))).changed == [cancelled_id]
    config = Config(
        dsn=dsn,
        poll_interval_s=0.1,
        flush_interval_s=0.01,
        retry_base_s=0.05,
        retry_cap_s=0.05,
        history=True,
        completed_jobs="archive",
    )
    worker = Worker(config, registry)
    successes = {*ok_ids, *keyed, windowed, int(answer_id), flaky_id}

    def done() -> bool:
        return set(_archived(dsn)) == successes

    run_async(run_worker_until(worker, done, 60, "every success archived"))
    assert status_counts(dsn) == {"discarded": 1, "cancelled": 1}
    assert set(_archived(dsn).values()) == {"completed"}
    assert (
        fetchval(
            dsn,
            "SELECT count(*) FROM dispatcher_jobs_archive WHERE completed_at IS NULL OR lock_token "
            "IS NOT NULL OR lease_expires_at IS NOT NULL OR updated_at <> completed_at",
        )
        == 0
    )
    # An ordering key's jobs ran in order, each promoted by its predecessor's archiving completion.
    starts = fetchall(
        dsn,
        "SELECT id FROM dispatcher_jobs_archive WHERE ordering_key = 'acct-1' ORDER BY locked_at",
    )
    assert [r[0] for r in starts] == keyed
    # Readers.
    shown = show_job(dsn, ok_ids[0])
    assert shown is not None and shown.job["status"] == "completed"
    assert shown.job["payload"] == {"order": 0} and [a.outcome for a in shown.attempts] == [
        "completed"
    ]
    listed = list_jobs(dsn, Filters(statuses=("completed",)), limit=500)
    assert {j.id for j in listed} == successes
    newest = [cancelled_id, doomed_id, flaky_id, int(answer_id)]  # both tables, newest first
    assert [j.id for j in list_jobs(dsn, limit=4)] == newest
    found = search_jobs(dsn, Filters(payload=({"order": 7},)))
    assert [j.id for j in found.jobs] == [ok_ids[7]]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert answer_id.result_sync(timeout=5, using=conn) == {"n": 42}
    # The window, closed when the job left the jobs table, still refuses the key.
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert enqueue_sync(conn, "ok", {}, dedupe_key="nightly", dedupe_window_s=3600) is None
    # A purge reaches archived jobs too.
    purged = purge_jobs(dsn, Filters(ids=(ok_ids[1], doomed_id)))
    assert sorted(purged.changed) == sorted([ok_ids[1], doomed_id])
    assert show_job(dsn, ok_ids[1]) is None and ok_ids[1] not in _archived(dsn)


def test_the_janitor_keeps_partitions_ahead_and_drops_them_past_retention_with_no_dead_tuple(
    dsn,
):
    """The upkeep, as a DML-only role (the function is SECURITY DEFINER): partitions exist
    ahead of the clock; a partition wholly past retention is dropped with its rows, leaving no
    dead tuple; default-partition rows past retention are deleted; newer rows stay."""
    _range_partitions_dropped(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # An old partition, as two hours of completions would have left it.
        conn.execute(
            "CREATE TABLE dispatcher_jobs_archive_old PARTITION OF dispatcher_jobs_archive "
            "FOR VALUES FROM (now() - interval '3 hours') TO (now() - interval '2 hours')"
        )
        conn.execute(
            "INSERT INTO dispatcher_jobs_archive (id, job_type, status, bucket, completed_at) "
            "SELECT g, 'a', 'completed', g % 64, now() - interval '150 minutes' "
            "FROM generate_series(1, 5000) AS g"
        )
        # Rows no partition covers land in the default one.
        conn.execute(
            "INSERT INTO dispatcher_jobs_archive (id, job_type, status, bucket, completed_at) "
            "SELECT g, 'a', 'completed', 0, now() - interval '10 days' "
            "FROM generate_series(5001, 5010) AS g"
        )

    async def keep_up(role_dsn: str) -> archive.Upkeep:
        store = JobStore(role_dsn, "janitor", completed_jobs="archive")
        try:
            return await archive.upkeep(store, 3600.0, 60.0, 1000)
        finally:
            await store.close()

    for role, role_dsn in dml_role(dsn):
        applied = dispatcher_cli("grants", "--role", role, "--apply", dsn=dsn)
        assert applied.returncode == 0, applied.stderr
        done = run_async(keep_up(role_dsn))
        assert done.dropped == 1 and done.default_deleted == 10
        again = run_async(keep_up(role_dsn))
        assert (again.created, again.dropped, again.default_deleted) == (0, 0, 0)
    parts = fetchall(dsn, query("archive_partitions"))
    assert "dispatcher_jobs_archive_old" not in [p[0] for p in parts]
    bounded = [p for p in parts if p[2] is not None]
    now = fetchval(dsn, "SELECT now()")
    # 900 s partitions (a quarter of the hour's retention), contiguous, at least two ahead.
    assert all((p[2] - p[1]).total_seconds() == 900 for p in bounded)
    assert all(a[2] == b[1] for a, b in itertools.pairwise(bounded))
    assert bounded[0][1] <= now and bounded[-1][2].timestamp() >= now.timestamp() + 1800
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs_archive") == 0
    assert _dead_tuples(dsn) == 0


def test_a_new_period_fills_up_to_its_boundary_and_starts_past_what_the_default_partition_took(
    dsn,
):
    """A fleet whose retention changes from an hour (900 s partitions) to forever (a day each):
    the first new partition runs from the last one's end, or from past the newest row the default
    partition took there, up to the next midnight, then a day each; nothing overlaps, so ATTACH
    never fails, and the row in the default partition stays where it is."""
    _range_partitions_dropped(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM dispatcher_archive_maintain(900, 0, 0, 0)")
        conn.execute(
            "INSERT INTO dispatcher_jobs_archive (id, job_type, status, bucket, completed_at) "
            "SELECT 1, 'a', 'completed', 0, max(to_at) + interval '90 seconds' "
            f"FROM ({query('archive_partitions')}) AS p"
        )
    store = JobStore(dsn, "janitor", completed_jobs="archive")
    try:
        done = run_async(archive.upkeep(store, 0.0, 60.0, 100))
    finally:
        run_async(store.close())
    parts = [p for p in fetchall(dsn, query("archive_partitions")) if p[2] is not None]
    quarter, *days = parts
    assert done.created == len(days) >= 2 and (quarter[2] - quarter[1]).total_seconds() == 900
    # The row sits 90 s past the quarter; the next partition starts at the minute after it.
    assert (days[0][1] - quarter[2]).total_seconds() == 120
    assert all(p[2].timestamp() % 86400 == 0 for p in days)
    assert all(a[2] == b[1] for a, b in itertools.pairwise(days))
    assert days[-1][2].timestamp() >= fetchval(dsn, "SELECT now()").timestamp() + 2 * 86400
    default = "SELECT count(*) FROM dispatcher_jobs_archive_default"
    assert fetchval(dsn, default) == 1


def test_archive_period_follows_the_retention():
    assert archive.period_s(60) == 60 and archive.period_s(3600) == 900
    assert archive.period_s(7 * 86400) == 86400 and archive.period_s(0) == 86400
    assert archive.period_s(4 * 3600) == 3600 and archive.ahead_s(60, 60) == 180


def test_an_old_release_completing_by_update_and_a_new_one_archiving_lose_no_job(empty_dsn):
    """A rolling upgrade: workers of a release without the archive complete by UPDATE (the `keep`
    statements) on a schema without it; the migration lands while they run; workers that archive
    start beside them, then the old ones stop. Every job runs exactly once and ends completed in
    exactly one table; the new janitor then moves the old release's completed rows."""
    migrate(empty_dsn, up_to=ARCHIVE - 1)
    runs: Counter[int] = Counter()
    registry = Registry()

    @registry.handler("work")
    async def work(job: Job) -> None:
        runs[job.id] += 1
        await asyncio.sleep(0.002)

    def enqueue(n: int) -> list[int]:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            return [int(enqueue_sync(conn, "work", {"i": i})) for i in range(n)]

    def config(completed_jobs: str) -> Config:
        return Config(
            dsn=empty_dsn,
            poll_interval_s=0.05,
            flush_interval_s=0.01,
            completed_jobs=completed_jobs,
            prune_interval_s=0.2,
            completed_retention_s=3600,
        )

    async def main() -> list[int]:
        ids = enqueue(300)
        old = [Worker(config("keep"), registry) for _ in range(2)]
        old_tasks = [asyncio.create_task(w.run()) for w in old]
        await asyncio.sleep(0)
        ids += await asyncio.to_thread(enqueue, 300)
        assert await asyncio.to_thread(migrate, empty_dsn, up_to=ARCHIVE) == [ARCHIVE]
        # The old release goes on completing by UPDATE: rows completed in the jobs table.
        await asyncio.to_thread(
            wait_until,
            lambda: status_counts(empty_dsn).get("completed", 0) > 0,
            30,
            "the old release's completions",
        )
        new = [Worker(config("archive"), registry) for _ in range(2)]
        new_tasks = [asyncio.create_task(w.run()) for w in new]
        ids += await asyncio.to_thread(enqueue, 300)
        for w in old:
            w.stop()
        await asyncio.gather(*old_tasks)
        ids += await asyncio.to_thread(enqueue, 300)

        def settled() -> bool:
            return fetchval(empty_dsn, "SELECT count(*) FROM dispatcher_jobs") == 0 and fetchval(
                empty_dsn, "SELECT count(*) FROM dispatcher_jobs_archive"
            ) == len(ids)

        try:
            await asyncio.to_thread(wait_until, settled, 90, "every job archived")
        finally:
            for w in new:
                w.stop()
            await asyncio.gather(*new_tasks)
        return ids

    ids = run_async(main())
    assert len(ids) == 1200 and sorted(runs) == sorted(ids)
    assert set(runs.values()) == {1}, "a job ran twice"
    archived = fetchall(empty_dsn, "SELECT id, count(*) FROM dispatcher_jobs_archive GROUP BY id")
    assert dict(archived) == dict.fromkeys(ids, 1)


@pytest.mark.parametrize("completed_jobs", ["keep", "delete"])
def test_the_other_settings_leave_the_archive_empty(dsn, completed_jobs):
    registry = Registry()

    @registry.handler("ok")
    async def ok(job: Job) -> None:
        return None

    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "ok", [{}] * 20)
    worker = Worker(
        Config(dsn=dsn, poll_interval_s=0.05, flush_interval_s=0.01, completed_jobs=completed_jobs),
        registry,
    )
    left = 20 if completed_jobs == "keep" else 0

    def finished() -> bool:
        return status_counts(dsn) == ({"completed": 20} if left else {})

    run_async(run_worker_until(worker, finished, 30, "20 finished"))
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs_archive") == 0


def _archive_pruner(store: JobStore, completed_retention_s: float, batch: int) -> Pruner:
    """The janitor of an archiving fleet, failed jobs and history kept forever."""
    retentions_s = {"completed": completed_retention_s, "failed": 0.0, "history": 0.0}
    return Pruner(
        store,
        RetentionSettings(interval_s=60, retentions_s=retentions_s, batch=batch, archive=True),
    )


def test_the_pruner_under_archive_never_retires_even_with_completed_kept_forever(dsn):
    store = JobStore(dsn, "w", completed_jobs="archive")
    pruner = _archive_pruner(store, 0, 100)
    run_async(pruner.tick())
    run_async(store.close())
    assert not pruner.retired and pruner.last_upkeep is not None


def test_the_archive_lag_is_how_far_past_retention_the_oldest_row_left_is(dsn):
    """Rows the default partition took ten days ago, more than one round deletes: the first round
    exports about ten days less the hour of retention as the archive's lag, the last one 0."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dispatcher_jobs_archive (id, job_type, status, bucket, completed_at) "
            "SELECT g, 'a', 'completed', 0, now() - interval '10 days' "
            "FROM generate_series(1, 3) AS g"
        )
    store = JobStore(dsn, "w", completed_jobs="archive")
    pruner = _archive_pruner(store, 3600, 2)

    def lag_s() -> float | None:
        return REGISTRY.get_sample_value("dispatcher_janitor_lag_seconds", {"kind": "archive"})

    try:
        run_async(pruner.tick())
        assert pruner.last_upkeep is not None and pruner.last_upkeep.default_deleted == 2
        assert 10 * 86400 - 3600 - 60 < (lag_s() or 0) < 10 * 86400
        run_async(pruner.tick())
        assert pruner.last_upkeep.default_deleted == 1 and lag_s() == 0
    finally:
        run_async(store.close())
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs_archive") == 0


def test_a_worker_creates_the_partitions_before_its_first_claim(dsn):
    """A fleet that starts archiving long after the migration (or after being down longer than
    the janitor looks ahead) finds no partition covering the clock: the worker creates them before
    its first claim, so no completion lands in the default partition, where retention would have
    to delete it row by row. (The janitor's own first round comes up to 5 s after the start.)"""
    _range_partitions_dropped(dsn)
    registry = Registry()

    @registry.handler("ok")
    async def ok(job: Job) -> None:
        return None

    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(50):
            enqueue_sync(conn, "ok", {"i": i})
    config = Config(
        dsn=dsn,
        poll_interval_s=0.05,
        flush_interval_s=0.01,
        completed_jobs="archive",
        completed_retention_s=3600,
    )
    worker = Worker(config, registry)

    def finished() -> bool:
        return fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs_archive") == 50

    run_async(run_worker_until(worker, finished, 30, "50 archived"))
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs_archive_default") == 0
    now = fetchval(dsn, "SELECT now()")
    covering = [p for p in fetchall(dsn, query("archive_partitions")) if p[2] is not None]
    assert covering and covering[0][1] <= now < covering[-1][2]
