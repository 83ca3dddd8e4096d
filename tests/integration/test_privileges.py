"""Least privilege: the owner migrates, the workers run as a role with DML only
(docs/operations/roles.md).

The roles are real (CREATE ROLE ... LOGIN on the test server, which trusts its clients) and are
dropped after each test; nothing is mocked.
"""

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from coordinator.pg.connect import ConnectionLimits
from dispatcher import JobSpec, enqueue_many_sync, enqueue_payloads_sync
from dispatcher.db.migrate import migrate
from dispatcher.db.privileges import schema_objects
from dispatcher.db.store import JobStore
from dispatcher.errors import MigrationError
from dispatcher.runtime.maintenance import PlannerStats
from dispatcher.runtime.table_sampler import LEASE_NAME, TableSampler
from dispatcher.serve.startup import StartupError, wait_until_ready
from tests.helpers import (
    ROOT,
    analyze_if_stale,
    fetchall,
    fetchval,
    run_async,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
    wait_until_async,
)

ANALYZE_WARNING = "planner statistics: role"


def dispatcher_cli(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    if dsn is not None:
        env["DISPATCHER_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dml_role(admin_dsn: str):
    """A LOGIN role with no privileges yet, and a DSN that logs in as it; yielded by fixtures."""
    role = f"dispatcher_worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        yield role, psycopg.conninfo.make_conninfo(admin_dsn, user=role)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            # Its grants live in this database: gone with DROP OWNED, then the role can go.
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def worker_role(dsn):
    """(role, its DSN) on the migrated test database; no grants applied yet."""
    yield from dml_role(dsn)


@pytest.fixture
def empty_db_role(empty_dsn):
    yield from dml_role(empty_dsn)


def grant(owner_dsn: str, role: str) -> None:
    """Apply what `dispatcher grants --role ROLE` prints, as the owner."""
    printed = dispatcher_cli("grants", "--role", role)
    assert printed.returncode == 0, printed.stderr
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute(printed.stdout.encode())  # bytes: a multi-statement script


def test_the_derived_objects_are_exactly_what_a_migrated_database_holds(dsn):
    objects = schema_objects()
    rows = fetchall(
        dsn,
        # Not the archive's partitions: reached (and granted) through the archive alone.
        """SELECT c.relkind::text, c.relname FROM pg_class c
            WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'S')
              AND NOT c.relispartition""",
    )
    assert sorted(name for kind, name in rows if kind != "S") == sorted(objects.tables)
    assert sorted(name for kind, name in rows if kind == "S") == sorted(objects.sequences)
    functions = fetchall(
        dsn, "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace"
    )
    assert sorted(name for (name,) in functions) == sorted(objects.functions)


def test_a_dml_only_role_runs_workers_enqueues_and_is_told_the_schema_is_up_to_date(
    dsn, worker_role, tmp_path
):
    role, role_dsn = worker_role
    grant(dsn, role)

    migrated = dispatcher_cli("migrate", dsn=role_dsn)
    assert (migrated.returncode, migrated.stdout.strip()) == (0, "schema is up to date"), (
        migrated.stderr
    )

    with psycopg.connect(role_dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "record", [{}] * 300)
        # dedupe keys take the staging path: a temporary table, then INSERT ... ON CONFLICT
        specs = [JobSpec("record", {}, dedupe_key=f"k{i % 50}") for i in range(100)]
        assert enqueue_many_sync(conn, specs) == 50
    log = tmp_path / "worker.out"
    # reaper_interval_s paces PlannerStats too: it would ask again every ~0.3 s if it retried.
    worker = start_worker(
        role_dsn,
        tmp_path,
        log_path=log,
        lease_s=3,
        poll_interval_s=0.2,
        flush_interval_s=0.02,
        reaper_interval_s=0.3,
        worker_id="least-privilege",
    )
    try:
        wait_until(
            lambda: status_counts(dsn).get("completed") == 350,
            60,
            "350 jobs completed by the DML-only role",
        )
        wait_until(
            lambda: ANALYZE_WARNING in log.read_text(), 10, "the worker's one warning about ANALYZE"
        )
        # Its group's first assignment waits 1 s for other members; a coordinator that cannot
        # write leaves it at 0.
        wait_until(
            lambda: (
                fetchval(
                    dsn,
                    "SELECT count(*) FROM dispatcher_bucket_owners WHERE owner = 'least-privilege'",
                )
                == 64
            ),
            10,
            "the PostgreSQL coordinator works for the DML-only role: "
            "the worker owns the 64 buckets",
        )
    finally:
        codes = stop_workers([worker])
    status = dispatcher_cli("status", dsn=role_dsn)
    assert status.returncode == 0 and "completed" in status.stdout, status.stderr
    text = log.read_text()
    assert codes == [0], text[-3000:]
    warnings = [line for line in text.splitlines() if ANALYZE_WARNING in line]
    assert len(warnings) == 1, warnings
    assert f"role {role} may not ANALYZE dispatcher_jobs" in warnings[0]
    assert (
        f"GRANT MAINTAIN ON dispatcher_jobs TO {role}" in warnings[0]
        or "PostgreSQL 17" in warnings[0]
    )
    # no other service was refused
    assert " failed: " not in text and "Traceback" not in text, text[-3000:]


def test_migrating_as_the_workers_role_names_the_owner_when_there_is_something_to_apply(
    empty_dsn, empty_db_role
):
    _role, role_dsn = empty_db_role
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # the default since PostgreSQL 15
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    with pytest.raises(
        MigrationError, match="must run as the role that owns the dispatcher tables"
    ):
        migrate(role_dsn)
    assert fetchval(empty_dsn, "SELECT to_regclass('dispatcher_schema_version')") is None


def test_grants_apply_gives_exactly_the_printed_privileges(dsn, worker_role):
    role, role_dsn = worker_role
    applied = dispatcher_cli("grants", "--role", role, "--apply", dsn=dsn)
    assert applied.returncode == 0, applied.stderr
    privileges = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
    held = dict(
        fetchall(
            dsn,
            """SELECT c.relname,
                      array_agg(p ORDER BY p) FILTER (WHERE has_table_privilege(%s, c.oid, p))
                 FROM pg_class c, unnest(%s::text[]) p
                WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
                  AND NOT c.relispartition
                GROUP BY c.relname""",
            (role, list(privileges)),
        )
    )
    assert held.pop("dispatcher_schema_version") == ["SELECT"]
    assert {table: sorted(held[table]) for table in held} == {
        table: ["DELETE", "INSERT", "SELECT", "UPDATE"] for table in schema_objects().tables[1:]
    }
    assert fetchval(dsn, "SELECT has_schema_privilege(%s, 'public', 'CREATE')", (role,)) is False
    # and it can do its job: one claim as that role
    with psycopg.connect(role_dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{}] * 3)

    async def claim():
        store = JobStore(role_dsn, "w")
        try:
            return (await store.jobs_claim("default", 10, 30, None)).jobs
        finally:
            await store.close()

    assert len(run_async(claim())) == 3


def planner_stats_lines(role_dsn: str, caplog) -> tuple[PlannerStats, list[logging.LogRecord]]:
    """Run PlannerStats as the role of `role_dsn` until it retires; its log records."""

    async def main():
        store = JobStore(role_dsn, "w")
        stats = PlannerStats(store, interval_s=0.01)
        try:
            # run() returns only once the service retired: it will never ask again.
            await asyncio.wait_for(stats.run(), timeout=10)
        finally:
            await store.close()
        return stats

    with caplog.at_level(logging.DEBUG, logger="dispatcher.runtime.maintenance"):
        stats = run_async(main())
    records = [
        r
        for r in caplog.records
        if r.name == "dispatcher.runtime.maintenance" and r.levelno >= logging.INFO
    ]
    return stats, records


def test_planner_stats_without_permission_say_so_once_as_info_and_stop_asking(
    dsn, worker_role, caplog
):
    """The documented two-role setup: the workers' role may not ANALYZE, and autovacuum keeps
    the statistics fresh. Nothing is wrong: one INFO line, whose hint is whole. (On a server run
    with autovacuum off, as some test servers are, nobody refreshes them: one WARNING.)"""
    role, role_dsn = worker_role
    grant(dsn, role)
    autovacuum = fetchval(dsn, "SHOW autovacuum") == "on"
    stats, records = planner_stats_lines(role_dsn, caplog)
    assert stats.retired
    assert [r.levelname for r in records] == ["INFO" if autovacuum else "WARNING"], [
        r.getMessage() for r in records
    ]
    line = records[0].getMessage()
    assert f"role {role} may not ANALYZE dispatcher_jobs" in line and "\n" not in line
    assert (
        "leaves them to autovacuum (not asked again)" if autovacuum else "nobody refreshes them"
    ) in line
    assert line.endswith(
        f"GRANT MAINTAIN ON dispatcher_jobs TO {role}"
        if fetchval(dsn, "SHOW server_version_num") >= "170000"
        else "the table or of the database may ANALYZE it (17 has GRANT MAINTAIN)"
    ), line


def test_planner_stats_warn_when_autovacuum_is_off_for_the_table_too(dsn, worker_role, caplog):
    role, role_dsn = worker_role
    grant(dsn, role)
    with psycopg.connect(dsn, autocommit=True) as conn:  # as the owner
        conn.execute("ALTER TABLE dispatcher_jobs SET (autovacuum_enabled = false)")
    stats, records = planner_stats_lines(role_dsn, caplog)
    assert stats.retired
    assert [r.levelname for r in records] == ["WARNING"], [r.getMessage() for r in records]
    line = records[0].getMessage()
    assert f"role {role} may not ANALYZE dispatcher_jobs, and autovacuum is off" in line
    assert "nobody refreshes them" in line


PG15_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.mark.skipif(not (PG15_BIN / "postgres").exists(), reason="no PostgreSQL 15 installed")
def test_on_postgresql_15_the_two_role_setup_starts_workers_without_a_warning(tmp_path):
    """The README's setup on PostgreSQL 15, where MAINTAIN does not exist: a worker of the DML-only
    role used to log a WARNING whose hint stopped mid-sentence ("... of the database may")."""
    from dispatcher.devtools.embedded import start_postgres

    with start_postgres(system_bindir=PG15_BIN) as server:
        owner_dsn = server.dsn
        assert fetchval(owner_dsn, "SHOW server_version_num").startswith("15")
        migrate(owner_dsn)
        with contextlib.contextmanager(dml_role)(owner_dsn) as (role, role_dsn):
            grant(owner_dsn, role)
            with psycopg.connect(role_dsn, autocommit=True) as conn:
                enqueue_payloads_sync(conn, "record", [{}] * 20)
            log = tmp_path / "worker.out"
            worker = start_worker(
                role_dsn, tmp_path, log_path=log, reaper_interval_s=0.3, worker_id="pg15"
            )
            try:
                wait_until(
                    lambda: status_counts(owner_dsn).get("completed") == 20, 60, "20 jobs done"
                )
                wait_until(lambda: ANALYZE_WARNING in log.read_text(), 10, "the line about ANALYZE")
            finally:
                codes = stop_workers([worker])
            text = log.read_text()
            assert codes == [0], text[-3000:]
            (line,) = [line for line in text.splitlines() if ANALYZE_WARNING in line]
            assert " INFO dispatcher.runtime.maintenance: " in line, line
            assert "(17 has GRANT MAINTAIN) worker=pg15" in line, line
            assert " WARNING " not in text and " ERROR " not in text, text[-3000:]


def test_planner_stats_work_for_a_role_granted_maintain(dsn, worker_role):
    if fetchval(dsn, "SHOW server_version_num") < "170000":
        pytest.skip("MAINTAIN is a privilege from PostgreSQL 17 on")
    role, role_dsn = worker_role
    grant(dsn, role)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT MAINTAIN ON dispatcher_jobs TO {}").format(sql.Identifier(role))
        )
        conn.execute(
            "INSERT INTO dispatcher_jobs (job_type, bucket) "
            "SELECT 'a', g % 64 FROM generate_series(1, 20000) g"
        )
    analyze_if_stale(role_dsn)
    assert (
        fetchval(dsn, "SELECT reltuples FROM pg_class WHERE relname = 'dispatcher_jobs'") == 20000
    )


def test_a_worker_waiting_for_the_schema_also_waits_for_its_grants(dsn, worker_role, caplog):
    """First deployment: the migration Job migrates, then grants; a worker started meanwhile
    with --wait-for-schema waits for both instead of exiting (without it: one line, exit)."""
    role, role_dsn = worker_role
    limits = ConnectionLimits(connect_timeout_s=2, statement_timeout_s=2)

    async def main():
        stopping = asyncio.Event()
        waiting = asyncio.create_task(
            wait_until_ready(role_dsn, limits, wait_for_schema=True, stopping=stopping)
        )
        await wait_until_async(
            lambda: "waiting for the migration Job's" in caplog.text, 10, "a line saying why"
        )
        assert not waiting.done()
        await asyncio.to_thread(grant, dsn, role)
        return await asyncio.wait_for(waiting, 15)

    with pytest.raises(
        StartupError, match=r"permission denied .* \(grant it with `dispatcher grants`\)"
    ):
        run_async(
            wait_until_ready(role_dsn, limits, wait_for_schema=False, stopping=asyncio.Event())
        )
    with caplog.at_level(logging.WARNING, logger="dispatcher.serve.startup"):
        assert run_async(main()) is True


def test_a_dml_only_role_takes_renews_releases_and_takes_over_the_table_sampler_lease(
    dsn, worker_role
):
    """The one-pod-at-a-time sampler role (migration 0006) needs nothing but the granted DML."""
    role, role_dsn = worker_role
    grant(dsn, role)
    with psycopg.connect(role_dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{}] * 3)

    async def main():
        stores = [
            JobStore(role_dsn, name, application_name="dispatcher-maint") for name in ("a", "b")
        ]
        a, b = (TableSampler(store, interval_s=0.2) for store in stores)  # lease: 0.6 s
        try:
            await a.tick()
            await b.tick()
            assert (a.holding, b.holding) == (True, False)
            assert {(d.queue, d.status): d.jobs for d in a.sample.depth}[("default", "queued")] == 3
            assert a.sample.pressure is not None and b.sample is None
            await a.tick()  # renewed by its holder
            await a.release()
            await b.tick()
            assert (a.holding, b.holding) == (False, True)
            await a.tick()
            assert not a.holding

            # b stops renewing (a dead pod): a takes over once the lease, on the database's clock,
            # ran out.
            async def a_holds():
                await a.tick()
                return a.holding

            await wait_until_async(a_holds, 10, "a takes over after b's lease ran out")
            return fetchall(dsn, "SELECT name, holder FROM dispatcher_maintenance_leases")
        finally:
            for store in stores:
                await store.close()

    assert run_async(main()) == [(LEASE_NAME, "a")]
