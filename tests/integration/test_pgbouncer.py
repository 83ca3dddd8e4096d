"""Behind a real PgBouncer in transaction pooling (tests/pgbouncer.py), with the settings of
docs/operations/pgbouncer.md: session locks off, prepared statements off (PgBouncer < 1.21),
LISTEN on a direct connection.

Every transaction of a client may run on another server connection there, so these tests show
that enqueue, migrations, claims, completions, heartbeats and the PostgreSQL coordinator need no
session state, and that wake-ups still arrive through the direct LISTEN connection.
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from coordinator.pg.connect import ConnectionLimits
from dispatcher import (
    Config,
    Job,
    JobSpec,
    Registry,
    Worker,
    enqueue,
    enqueue_many_sync,
    enqueue_payloads_sync,
    enqueue_sync,
)
from dispatcher.db.migrate import available_migrations, current_version, migrate
from dispatcher.db.store import JobStore
from dispatcher.errors import StoreError
from tests.helpers import (
    Deadline,
    fetchall,
    fetchval,
    overlapping,
    read_executions,
    run_async,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
    wait_until_async,
)

# What docs/operations/pgbouncer.md asks of a worker whose DISPATCHER_DSN goes through it.
BEHIND_PGBOUNCER = dict(session_locks=False, prepared_statements=False)
FAST = dict(poll_interval_s=0.2, flush_interval_s=0.02, reaper_interval_s=0.3)


def server_sessions(dsn: str) -> list[str]:
    """application_name of the sessions on the server in dsn's database (ours excluded)."""
    return [
        row[0]
        for row in fetchall(
            dsn,
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
    ]


def test_the_fixture_multiplexes_clients_over_server_connections(dsn, pgbouncer):
    """Two clients, one after the other, are served by the same server session: transaction
    pooling is really on (else the rest of this file would prove nothing)."""
    pooled = pgbouncer.dsn_for(dsn)
    with (
        psycopg.connect(pooled, autocommit=True) as a,
        psycopg.connect(pooled, autocommit=True) as b,
    ):
        first = a.execute("SELECT pg_backend_pid()").fetchone()
        second = b.execute("SELECT pg_backend_pid()").fetchone()
        assert len(pgbouncer.clients()) == 2  # two clients, one server session
        assert first == second


def test_psycopg_prepared_statements_break_behind_it_unless_turned_off(dsn, pgbouncer):
    """Why DISPATCHER_PREPARED_STATEMENTS exists: psycopg prepares a statement on its 6th run on
    a connection, and PgBouncer < 1.21 does not carry it to the next server connection."""
    if pgbouncer.version >= (1, 21):
        pytest.skip(f"PgBouncer {pgbouncer.version} can carry protocol-level prepared statements")
    pooled = pgbouncer.dsn_for(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{}] * 100)

    async def claims(prepared: bool) -> int:
        stores = [
            JobStore(pooled, f"w{i}", limits=ConnectionLimits(prepared_statements=prepared))
            for i in range(4)
        ]
        errors = 0
        try:
            # One client at a time: PgBouncer hands each the server connection the last one used,
            # where psycopg's names (_pg3_0, ...) of the other clients already exist, or not yet.
            for _ in range(8):
                for store in stores:
                    try:
                        await store.jobs_claim("default", 1, 30, None)
                    except StoreError:
                        errors += 1
        finally:
            for store in stores:
                await store.close()
        return errors

    assert run_async(claims(True)) > 0, (
        "prepared statements worked: is this PgBouncer newer than it says?"
    )
    assert run_async(claims(False)) == 0


def test_enqueue_through_pgbouncer(dsn, pgbouncer):
    """Your own connections through PgBouncer need prepare_threshold=None too
    (docs/operations/pgbouncer.md)."""
    pooled = pgbouncer.dsn_for(dsn)
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as conn:
        ids = [enqueue_sync(conn, "one", {"n": i}, dedupe_key=f"one-{i}") for i in range(10)]
        assert None not in ids
        assert enqueue_sync(conn, "one", {"n": 0}, dedupe_key="one-0") is None  # a live duplicate
        with conn.transaction():  # the outbox: the caller's transaction, on one server connection
            enqueue_sync(conn, "outbox", {})
            enqueue_sync(conn, "outbox", {})
        # dedupe keys: staged in a temporary table (left on whichever server connection ran it)
        for _ in range(3):
            assert enqueue_many_sync(
                conn, [JobSpec("many", {}, dedupe_key=f"m{i}") for i in range(40)]
            ) in (40, 0)
        assert enqueue_payloads_sync(conn, "bulk", [{}] * 500) == 500

    async def enqueue_async():
        async with await psycopg.AsyncConnection.connect(
            pooled, autocommit=True, prepare_threshold=None
        ) as conn:
            for _ in range(10):
                await enqueue(conn, "async")

    run_async(enqueue_async())
    counts = dict(fetchall(dsn, "SELECT job_type, count(*) FROM dispatcher_jobs GROUP BY job_type"))
    assert counts == {"one": 10, "outbox": 2, "many": 40, "bulk": 500, "async": 10}


def test_migrations_through_pgbouncer_apply_once_from_four_runners(empty_dsn, pgbouncer):
    pooled = pgbouncer.dsn_for(empty_dsn)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: migrate(pooled), range(4)))
    # the advisory xact lock held
    assert sorted(map(bool, results)) == [False, False, False, True], results
    assert migrate(pooled) == []
    assert current_version(pooled) == available_migrations()[-1].version


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_worker_process_drains_through_pgbouncer(dsn, pgbouncer, tmp_path, mode):
    """A real `dispatcher run` whose every statement goes through PgBouncer (LISTEN excepted):
    claims, completions, the reaper, the table sampler's lease and, in partitioned mode, the
    PostgreSQL coordinator with leases only. Five jobs run 1.5 leases long: each completes in one
    attempt only if its heartbeats, through PgBouncer too, kept its lease alive."""
    pooled = pgbouncer.dsn_for(dsn)
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as conn:
        enqueue_payloads_sync(conn, "record", [{}] * 2000)
        enqueue_payloads_sync(conn, "record_slow", [{"s": 3.0}] * 5)
    log = tmp_path / "worker.out"
    worker = start_worker(
        pooled,
        tmp_path,
        log_path=log,
        mode=mode,
        listen_dsn=dsn,
        lease_s=2,
        batch_size=50,
        concurrency=50,
        worker_id="pooled",
        **BEHIND_PGBOUNCER,
        **FAST,
    )
    try:
        wait_until(lambda: status_counts(dsn).get("completed") == 2005, 90, "2005 jobs completed")
        clients = pgbouncer.clients()
        owned = fetchval(
            dsn, "SELECT count(*) FROM dispatcher_bucket_owners WHERE owner = 'pooled'"
        )
        wait_until(
            lambda: fetchval(dsn, "SELECT holder FROM dispatcher_maintenance_leases") == "pooled",
            30,
            "the table sampler's lease taken through PgBouncer",
        )
    finally:
        codes = stop_workers([worker])
    text = log.read_text()
    assert codes == [0], text[-3000:]
    assert " WARNING " not in text and " ERROR " not in text, text[-3000:]
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE attempts <> 1") == 0, (
        "a lease ran out"
    )
    executions = read_executions(tmp_path)
    assert len(executions) == 2005 and all(len(runs) == 1 for runs in executions.values())
    assert not overlapping(executions)
    assert {"dispatcher-claim", "dispatcher-complete", "dispatcher-maint"} <= set(clients), clients
    assert "dispatcher-listen" not in clients, (
        "LISTEN went through PgBouncer, where it hears nothing"
    )
    if mode == "partitioned":
        assert (
            "dispatcher-coordinator" in clients and "dispatcher-coordinator-listen" not in clients
        ), clients
        assert owned == 64, "the coordinator did not assign the buckets through PgBouncer"


def test_a_notify_sent_through_pgbouncer_wakes_a_worker_listening_directly(dsn, pgbouncer):
    """Poll interval 30 s: only the notification (sent at the enqueue's commit, through
    PgBouncer) heard on the direct LISTEN connection explains a pick-up within seconds."""
    pooled = pgbouncer.dsn_for(dsn)
    registry = Registry()
    done: list[float] = []

    @registry.handler("ping")
    async def ping(job: Job) -> None:
        done.append(time.monotonic())

    worker = Worker(
        Config(
            dsn=pooled,
            listen_dsn=dsn,
            poll_interval_s=30,
            flush_interval_s=0.01,
            **BEHIND_PGBOUNCER,
        ),
        registry,
    )

    async def main():
        task = asyncio.create_task(worker.run())
        try:

            def owns_all() -> bool:
                return len(worker.assignments["default"].owned() or ()) == 64

            await wait_until_async(
                lambda: worker.listening.is_set() and owns_all() and worker.idle,
                15,
                "the worker to own every bucket, listen, and sleep",
            )
            clients = await asyncio.to_thread(pgbouncer.clients)
            async with await psycopg.AsyncConnection.connect(
                pooled, autocommit=True, prepare_threshold=None
            ) as conn:
                sent = time.monotonic()
                await enqueue(conn, "ping")
                await wait_until_async(
                    lambda: done, Deadline(5), "the ping handled", interval_s=0.01
                )
        finally:
            worker.stop()
            await task
        return done[0] - sent, clients

    latency, clients = run_async(main())
    assert latency < 2.0, latency
    assert "dispatcher-claim" in clients and "dispatcher-listen" not in clients, clients


def test_listen_off_means_polling_only_and_no_listen_connection(dsn, pgbouncer):
    """listen_dsn=none, for a deployment that reaches PostgreSQL only through PgBouncer: the
    worker and its coordinator open no LISTEN connection and find jobs by polling."""
    pooled = pgbouncer.dsn_for(dsn)
    registry = Registry()
    done: list[int] = []

    @registry.handler("ping")
    async def ping(job: Job) -> None:
        done.append(job.id)

    worker = Worker(
        Config(
            dsn=pooled,
            listen_dsn="none",
            poll_interval_s=0.2,
            flush_interval_s=0.01,
            coordinator_lease_s=3,
            coordinator_poll_s=0.5,
            **BEHIND_PGBOUNCER,
        ),
        registry,
    )

    async def main():
        task = asyncio.create_task(worker.run())
        try:
            await wait_until_async(
                lambda: len(worker.assignments["default"].owned() or ()) == 64,
                15,
                "the worker to own every bucket (coordinator polling only)",
            )
            async with await psycopg.AsyncConnection.connect(
                pooled, autocommit=True, prepare_threshold=None
            ) as conn:
                for _ in range(20):
                    await enqueue(conn, "ping")
            await wait_until_async(lambda: len(done) == 20, 10, "20 pings handled by polling")
            sessions = await asyncio.to_thread(server_sessions, dsn)
            clients = await asyncio.to_thread(pgbouncer.clients)
        finally:
            worker.stop()
            await task
        return sessions, clients

    sessions, clients = run_async(main())
    assert not worker.listening.is_set()
    assert not [name for name in sessions + clients if name.endswith("-listen")], (
        sessions,
        clients,
    )
    assert "dispatcher-coordinator" in clients, clients


def test_the_admin_and_the_pruner_work_through_it_and_leave_no_session_state(dsn, pgbouncer):
    """The admin's statement_timeout is SET LOCAL (its transaction only) and its statements are
    never prepared; the pruner's lock is transaction-scoped: nothing reaches the next client."""
    from dispatcher.admin import Filters, list_jobs, retry_jobs
    from dispatcher.runtime.janitor import Pruner
    from dispatcher.settings.sections import RetentionSettings
    from tests.integration.test_admin import add

    pooled = pgbouncer.dsn_for(dsn)
    failed = add(dsn, 5, status="failed")
    add(dsn, 3, status="completed", age_s=7200)
    assert len(list_jobs(pooled, Filters(statuses=("failed",)))) == 5
    assert retry_jobs(pooled, Filters(statuses=("failed",)), batch=2).changed_count == 5
    assert set(
        fetchall(dsn, "SELECT status FROM dispatcher_jobs WHERE id = ANY(%s)", (failed,))
    ) == {("queued",)}
    store = JobStore(pooled, "pruner", limits=ConnectionLimits(prepared_statements=False))
    pruner = Pruner(
        store, RetentionSettings(interval_s=60, retentions_s={"completed": 3600}, batch=2)
    )

    async def prune():
        try:
            return await pruner.tick()
        finally:
            await store.close()

    run_async(prune())
    assert pruner.last_round.deleted == {"completed": 3}
    with psycopg.connect(pooled, autocommit=True) as next_client:
        assert next_client.execute("SHOW statement_timeout").fetchone() == ("0",)
        assert next_client.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        ).fetchone() == (0,)
