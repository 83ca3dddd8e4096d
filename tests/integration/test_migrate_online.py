"""Migration 0007 on a live table: from the schema before it, with rows; the index builds let
writes through (CREATE INDEX CONCURRENTLY, shown with a snapshot that holds the build up, not with
timing); an index a cut-short build left invalid is built again; and a migration that cannot get
its brief exclusive lock gives up after lock_timeout instead of queueing every claim behind it."""

import threading
import time

import psycopg
import pytest

from dispatcher.db.migrate import available_migrations, migrate
from dispatcher.errors import MigrationError
from tests.helpers import fetchall, fetchval, wait_until

CANCEL = 7  # 0007_cancel_and_retention
# the schema it upgrades
BEFORE = max(m.version for m in available_migrations() if m.version < CANCEL)
INDEXES = (
    "dispatcher_jobs_completed_idx",
    "dispatcher_jobs_unsuccessful_idx",
    "dispatcher_job_attempts_finished_idx",
)


def fill(dsn: str, n: int = 2000) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dispatcher_jobs (job_type, bucket, status, updated_at)
                        SELECT 't', i %% 64,
                               (ARRAY['queued', 'completed', 'failed', 'discarded'])[i %% 4 + 1],
                               now()
                          FROM generate_series(1, %s) AS i""",
            (n,),
        )
        conn.execute(
            "INSERT INTO dispatcher_job_attempts SELECT i, 1, 'w', now(), now(), 1, 'failed', NULL "
            "FROM generate_series(1, 100) AS i"
        )


def valid_indexes(dsn: str) -> dict[str, bool]:
    return dict(
        fetchall(
            dsn,
            "SELECT indexrelid::regclass::text, indisvalid FROM pg_index "
            "WHERE indrelid IN ('dispatcher_jobs'::regclass, 'dispatcher_job_attempts'::regclass)",
        )
    )


def test_upgrading_a_table_with_rows_gives_the_cancelled_status_and_the_new_indexes(empty_dsn):
    migrate(empty_dsn, up_to=BEFORE)
    fill(empty_dsn)
    assert migrate(empty_dsn, up_to=CANCEL) == [CANCEL]
    checks = dict(
        fetchall(
            empty_dsn,
            "SELECT conname, convalidated FROM pg_constraint WHERE conname IN "
            "('dispatcher_jobs_status_check', 'dispatcher_job_attempts_outcome_check')",
        )
    )
    assert checks == {
        "dispatcher_jobs_status_check": True,
        "dispatcher_job_attempts_outcome_check": True,
    }
    indexes = valid_indexes(empty_dsn)
    assert all(indexes.get(name) for name in INDEXES), indexes
    assert indexes["dispatcher_jobs_failed_idx"] is True  # kept: failures per queue, index-only
    assert fetchval(empty_dsn, "SELECT count(*) FROM dispatcher_jobs") == 2000
    fetchall(
        empty_dsn,
        "UPDATE dispatcher_jobs SET status = 'cancelled', cancel_requested_at = now() "
        "WHERE id = 1 RETURNING id",
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        fetchall(empty_dsn, "UPDATE dispatcher_jobs SET status = 'canceled' WHERE id = 2")
    fetchall(
        empty_dsn,
        "INSERT INTO dispatcher_job_attempts "
        "VALUES (1, 2, 'w', now(), now(), 1, 'cancelled', NULL) RETURNING job_id",
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        fetchall(
            empty_dsn,
            "INSERT INTO dispatcher_job_attempts VALUES (1, 2, 'w', now(), now(), 1, 'lost', NULL)",
        )
    assert migrate(empty_dsn, up_to=CANCEL) == []


def test_the_index_builds_let_the_workers_write(empty_dsn):
    migrate(empty_dsn, up_to=BEFORE)
    fill(empty_dsn)
    errors: list[BaseException] = []
    with psycopg.connect(empty_dsn) as old_snapshot:
        # A transaction older than the build: CREATE INDEX CONCURRENTLY waits for it to end.
        old_snapshot.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        old_snapshot.execute("SELECT 1")
        runner = threading.Thread(
            target=lambda: _capture(errors, lambda: migrate(empty_dsn, up_to=CANCEL))
        )
        runner.start()
        wait_until(
            lambda: fetchval(empty_dsn, "SELECT count(*) FROM pg_stat_progress_create_index") == 1,
            30,
            "an index build under way (waiting for the old transaction)",
        )
        # Meanwhile a worker's statements go through at once: the build holds SHARE UPDATE
        # EXCLUSIVE.
        with psycopg.connect(empty_dsn, autocommit=True) as worker:
            worker.execute("SET statement_timeout = '2s'")
            worker.execute("INSERT INTO dispatcher_jobs (job_type, bucket) VALUES ('t', 1)")
            worker.execute("UPDATE dispatcher_jobs SET status = 'running' WHERE id = 1")
            worker.execute("UPDATE dispatcher_jobs SET status = 'completed' WHERE id = 1")
            worker.execute("DELETE FROM dispatcher_jobs WHERE id = 2")
        assert runner.is_alive(), "the build was waiting all along"
        assert (
            fetchval(
                empty_dsn,
                "SELECT count(*) FROM dispatcher_schema_version WHERE version = %s",
                (CANCEL,),
            )
            == 0
        )
        old_snapshot.rollback()
        runner.join(60)
    assert not errors and not runner.is_alive()
    assert all(valid_indexes(empty_dsn).get(name) for name in INDEXES)
    assert (
        fetchval(
            empty_dsn,
            "SELECT count(*) FROM dispatcher_schema_version WHERE version = %s",
            (CANCEL,),
        )
        == 1
    )


def test_an_index_left_invalid_by_a_cut_short_build_is_built_again(empty_dsn):
    migrate(empty_dsn, up_to=BEFORE)
    fill(empty_dsn)
    # what a crash in the middle of a build leaves
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE INDEX dispatcher_jobs_completed_idx ON dispatcher_jobs (updated_at) "
            "WHERE status = 'completed'"
        )
        conn.execute(
            "UPDATE pg_index SET indisvalid = false "
            "WHERE indexrelid = 'dispatcher_jobs_completed_idx'::regclass"
        )
    assert migrate(empty_dsn, up_to=CANCEL) == [CANCEL]
    assert valid_indexes(empty_dsn)["dispatcher_jobs_completed_idx"] is True


def test_a_migration_that_cannot_get_its_exclusive_lock_gives_up_instead_of_queueing_claims(
    empty_dsn,
):
    migrate(empty_dsn, up_to=BEFORE)
    with psycopg.connect(empty_dsn) as long_reader:
        # holds ACCESS SHARE until it ends
        long_reader.execute("SELECT count(*) FROM dispatcher_jobs")
        started = time.monotonic()
        with pytest.raises(MigrationError, match="lock timeout"):
            migrate(empty_dsn, up_to=CANCEL)
        assert time.monotonic() - started < 30
        long_reader.rollback()
    assert fetchval(empty_dsn, "SELECT max(version) FROM dispatcher_schema_version") == BEFORE
    assert migrate(empty_dsn, up_to=CANCEL) == [CANCEL]  # run again, it completes


def _capture(errors: list[BaseException], work) -> None:
    try:
        work()
    except BaseException as exc:
        errors.append(exc)


def test_the_unique_keys_gain_the_bucket_on_a_live_table_and_keep_their_rules(empty_dsn):
    """Migration 0014 on a table holding live keyed jobs: the primary key becomes (id, bucket)
    and the holder and dedupe indexes include the bucket, yet one key still has one live job."""
    from dispatcher import enqueue_sync
    from dispatcher.api.enqueue import bucket_for

    migrate(empty_dsn, up_to=13)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # The jobs a release of the schema before 0014 enqueued (this one's enqueue writes columns
        # of later migrations): a deduplicated one, a key's holder and a job waiting behind it.
        insert = (
            "INSERT INTO dispatcher_jobs (job_type, bucket, dedupe_key, ordering_key, status) "
            "VALUES ('t', %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id"
        )
        assert conn.execute(insert, (3, "order-1", None, "queued")).fetchone() is not None
        assert conn.execute(insert, (5, "order-1", None, "queued")).fetchone() is None
        key = ("acct-7", bucket_for("acct-7"))
        assert conn.execute(insert, (key[1], None, key[0], "queued")).fetchone() is not None
        assert conn.execute(insert, (key[1], None, key[0], "waiting")).fetchone() is not None
    assert migrate(empty_dsn, up_to=14) == [14]
    assert migrate(empty_dsn, up_to=14) == []
    definitions = dict(
        fetchall(
            empty_dsn,
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'dispatcher_jobs'"
            " AND indexdef LIKE 'CREATE UNIQUE%%'",
        )
    )
    assert set(definitions) == {
        "dispatcher_jobs_pkey",
        "dispatcher_jobs_ordering_holder_idx",
        "dispatcher_jobs_dedupe_live_idx",  # queue-wide, kept for the previous release
        "dispatcher_jobs_dedupe_live_bucket_idx",
    }
    with_bucket = {n for n, d in definitions.items() if "bucket)" in d}
    assert with_bucket == set(definitions) - {"dispatcher_jobs_dedupe_live_idx"}, definitions
    assert "(id, bucket)" in definitions["dispatcher_jobs_pkey"]
    migrate(empty_dsn)  # what this release's enqueue writes (tags: 0017)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert enqueue_sync(conn, "t", {}, dedupe_key="order-2") is not None
        assert enqueue_sync(conn, "t", {}, dedupe_key="order-2") is None
        assert enqueue_sync(conn, "t", {}, ordering_key="acct-7") is not None
    holders = fetchval(
        empty_dsn,
        "SELECT count(*) FROM dispatcher_jobs WHERE ordering_key = 'acct-7' AND status = 'queued'",
    )
    assert holders == 1
    with (
        pytest.raises(psycopg.errors.UniqueViolation),
        psycopg.connect(empty_dsn, autocommit=True) as conn,
    ):
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'queued'"
            " WHERE ordering_key = 'acct-7' AND status = 'waiting'"
        )
