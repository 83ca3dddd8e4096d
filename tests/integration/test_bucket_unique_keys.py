"""Migration 0014 on a table with rows: every rule of dispatcher_jobs has a unique index that ends
with `bucket` (so the table can be distributed by bucket), the primary key is (id, bucket), the
queue-wide dedupe index stays for the previous release, and the rules keep their meaning: a dedupe
key is unique per queue, an ordering key still has one holder. A run cut short before its last
step completes when run again; a second run does nothing.
The placement itself, without a server: tests/unit/test_bucket_placement.py."""

from __future__ import annotations

import psycopg
import pytest

from dispatcher import JobSpec, enqueue_many_sync, enqueue_sync
from dispatcher.api.enqueue import bucket_for
from dispatcher.db.migrate import available_migrations, migrate
from dispatcher.errors import MigrationError
from tests.helpers import fetchall, fetchval, plan_nodes
from tests.integration.test_cli_errors import cli

BUCKET_KEYS = 14  # 0014_bucket_in_unique_keys
(MIGRATION,) = [m for m in available_migrations() if m.version == BUCKET_KEYS]
BEFORE = max(m.version for m in available_migrations() if m.version < BUCKET_KEYS)
HOLDER, DEDUPE = "dispatcher_jobs_ordering_holder_idx", "dispatcher_jobs_dedupe_live_idx"
DEDUPE_BUCKET = "dispatcher_jobs_dedupe_live_bucket_idx"
# The previous release's conflict target: its inserts must still find a matching index.
PREVIOUS_RELEASE_INSERT = """
INSERT INTO dispatcher_jobs (job_type, bucket, dedupe_key) VALUES ('t', %s, %s)
ON CONFLICT (queue_name, dedupe_key)
   WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running', 'waiting')
DO NOTHING RETURNING id
"""


def unique_indexes(dsn: str) -> dict[str, tuple[list[str], bool, bool, str | None]]:
    """Each unique index of dispatcher_jobs: its columns in order, primary, valid, predicate."""
    found = fetchall(
        dsn,
        """SELECT c.relname,
                  ARRAY(SELECT a.attname::text
                          FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
                          JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                         ORDER BY k.n),
                  i.indisprimary, i.indisvalid, pg_get_expr(i.indpred, i.indrelid)
             FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
            WHERE i.indrelid = 'dispatcher_jobs'::regclass AND i.indisunique""",
    )
    return {name: (columns, primary, valid, pred) for name, columns, primary, valid, pred in found}


def fill(dsn: str) -> None:
    """Rows as a release before 0014 wrote them: plain jobs in every status, live jobs with dedupe
    keys in random buckets (finished ones sharing their keys), a key's holder with jobs waiting
    behind it, and a halted key."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dispatcher_jobs (job_type, bucket, status)
               SELECT 'plain', i % 64,
                      (ARRAY['queued', 'running', 'completed', 'failed'])[i % 4 + 1]
                 FROM generate_series(1, 2000) AS i"""
        )
        conn.execute(
            """INSERT INTO dispatcher_jobs (job_type, bucket, status, dedupe_key)
               SELECT 'deduped', (i * 7) % 64, (ARRAY['queued', 'running', 'waiting'])[i % 3 + 1],
                      'd' || i
                 FROM generate_series(1, 100) AS i
               UNION ALL
               SELECT 'deduped', i % 64, 'completed', 'd' || (i % 100 + 1)
                 FROM generate_series(1, 300) AS i"""
        )
        for key, statuses in (("o1", ["queued", "waiting", "waiting"]), ("o2", ["failed"])):
            for status in statuses:
                conn.execute(
                    "INSERT INTO dispatcher_jobs (job_type, bucket, status, ordering_key, "
                    "ordering_halted) VALUES ('ordered', %s, %s, %s, %s)",
                    (bucket_for(key), status, key, status == "failed"),
                )


def test_the_migration_puts_bucket_in_every_unique_key_of_a_table_with_rows(empty_dsn):
    migrate(empty_dsn, up_to=BEFORE)
    fill(empty_dsn)
    before = unique_indexes(empty_dsn)
    rows = fetchval(empty_dsn, "SELECT count(*) FROM dispatcher_jobs")
    assert migrate(empty_dsn, up_to=BUCKET_KEYS) == [BUCKET_KEYS]

    after = unique_indexes(empty_dsn)
    assert after == {
        "dispatcher_jobs_pkey": (["id", "bucket"], True, True, None),
        HOLDER: (["queue_name", "ordering_key", "bucket"], False, True, before[HOLDER][3]),
        DEDUPE: before[DEDUPE],
        DEDUPE_BUCKET: (["queue_name", "dedupe_key", "bucket"], False, True, before[DEDUPE][3]),
    }
    assert before[HOLDER][0] == ["queue_name", "ordering_key"]  # the rules, with bucket added
    assert "status" in before[DEDUPE][3]
    assert (
        fetchval(
            empty_dsn,
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'dispatcher_jobs'::regclass AND contype = 'p'",
        )
        == "PRIMARY KEY (id, bucket)"
    )
    assert fetchval(empty_dsn, "SELECT count(*) FROM dispatcher_jobs") == rows

    # This release's enqueue writes columns of later migrations (tags: 0017); none of them touches
    # a unique index.
    migrate(empty_dsn)
    assert unique_indexes(empty_dsn) == after
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # a dedupe key alone: every enqueue of it goes to its bucket, where one live job holds it
        first = enqueue_sync(conn, "t", dedupe_key="fresh")
        assert first is not None
        assert enqueue_sync(conn, "t", dedupe_key="fresh") is None
        assert enqueue_many_sync(conn, [JobSpec("t", dedupe_key="fresh")] * 2) == 0
        assert enqueue_many_sync(conn, [JobSpec("t", dedupe_key="bulk")] * 3) == 1
        assert fetchall(
            empty_dsn,
            "SELECT dedupe_key, count(*), min(bucket) FROM dispatcher_jobs "
            "WHERE dedupe_key IN ('fresh', 'bulk') GROUP BY 1 ORDER BY 1",
        ) == [("bulk", 1, bucket_for("bulk")), ("fresh", 1, bucket_for("fresh"))]
        # the previous release's insert still runs, and a live key still holds its queue
        assert conn.execute(PREVIOUS_RELEASE_INSERT, (0, "fresh")).fetchone() is None
        assert conn.execute(PREVIOUS_RELEASE_INSERT, (0, "new")).fetchone() is not None
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                "INSERT INTO dispatcher_jobs (job_type, bucket, dedupe_key) "
                "SELECT 't', bucket, dedupe_key FROM dispatcher_jobs "
                "WHERE dedupe_key = 'd5' AND status IN ('queued', 'running', 'waiting')"
            )

        # an ordering key: one holder, the next job waits behind it
        head = enqueue_sync(conn, "t", ordering_key="o3")
        behind = enqueue_sync(conn, "t", ordering_key="o3")
        assert fetchall(
            empty_dsn,
            "SELECT id, status, bucket FROM dispatcher_jobs WHERE ordering_key = 'o3' ORDER BY id",
        ) == [(head, "queued", bucket_for("o3")), (behind, "waiting", bucket_for("o3"))]
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("UPDATE dispatcher_jobs SET status = 'queued' WHERE id = %s", (behind,))
        for key in ("o1", "o2"):  # a holder from before the migration, queued and halted
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute(
                    "INSERT INTO dispatcher_jobs (job_type, bucket, ordering_key) "
                    "VALUES ('t', %s, %s)",
                    (bucket_for(key), key),
                )
        # lookups by id still walk the primary key
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) SELECT status FROM dispatcher_jobs WHERE id = ANY(%s)",
            ([first, head, behind],),
        ).fetchone()[0][0]["Plan"]
        assert {n.get("Index Name") for n in plan_nodes(plan)} - {None} == {"dispatcher_jobs_pkey"}

    assert migrate(empty_dsn, up_to=BUCKET_KEYS) == []
    assert unique_indexes(empty_dsn) == after


def test_a_run_cut_short_before_its_last_step_completes_when_run_again(empty_dsn):
    migrate(empty_dsn, up_to=BEFORE)
    fill(empty_dsn)
    build, drop, swap = MIGRATION.steps
    assert build.autocommit and drop.autocommit and not swap.autocommit
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for statement in build.statements + drop.statements:
            conn.execute(statement.encode())
    # the state a lock timeout in the last step leaves: new indexes, the old holder index gone,
    # the old key
    halfway = unique_indexes(empty_dsn)
    assert sorted(halfway) == [
        "dispatcher_jobs_dedupe_live_bucket_idx",
        "dispatcher_jobs_dedupe_live_idx",
        "dispatcher_jobs_id_bucket_idx",
        "dispatcher_jobs_ordering_holder_bucket_idx",
        "dispatcher_jobs_pkey",
    ]
    with psycopg.connect(empty_dsn) as long_reader:
        long_reader.execute("SELECT count(*) FROM dispatcher_jobs")  # ACCESS SHARE until it ends
        with pytest.raises(MigrationError, match="lock timeout"):
            migrate(empty_dsn)
        long_reader.rollback()
    assert unique_indexes(empty_dsn) == halfway
    assert migrate(empty_dsn, up_to=BUCKET_KEYS) == [BUCKET_KEYS]
    assert {name: index[0] for name, index in unique_indexes(empty_dsn).items()} == {
        "dispatcher_jobs_pkey": ["id", "bucket"],
        HOLDER: ["queue_name", "ordering_key", "bucket"],
        DEDUPE: ["queue_name", "dedupe_key"],
        DEDUPE_BUCKET: ["queue_name", "dedupe_key", "bucket"],
    }


def test_every_unique_index_of_the_jobs_table_but_the_previous_releases_includes_the_bucket(dsn):
    """What distributing the table by bucket requires, for the indexes of later migrations too:
    only the queue-wide dedupe index lacks the bucket, and `migrate --citus` drops it."""
    indexes = unique_indexes(dsn)
    without = {name for name, (columns, *_) in indexes.items() if "bucket" not in columns}
    assert without == {DEDUPE}, indexes
    assert indexes[DEDUPE_BUCKET][0] == [*indexes[DEDUPE][0], "bucket"]


def test_jobs_with_a_window_stay_one_per_key_in_a_batch_whatever_places_them(dsn):
    """Two windowed jobs of one dedupe key in one batch, in different buckets: the dedupe index
    would let both in, but a key's window names one job, so the later one is refused, as it is
    one by one."""
    a = "a"
    taken = {bucket_for(a), bucket_for("v")}
    b = next(k for k in (f"b{n}" for n in range(100)) if bucket_for(k) not in taken)
    with psycopg.connect(dsn, autocommit=True) as conn:
        specs = [
            JobSpec("t", dedupe_key="w", dedupe_window_s=60, partition_key=a),
            JobSpec("t", dedupe_key="w", dedupe_window_s=60, partition_key=b),
        ]
        assert enqueue_many_sync(conn, specs) == 1
        plain_first = [
            JobSpec("t", dedupe_key="v"),
            JobSpec("t", dedupe_key="v", dedupe_window_s=60, partition_key=b),
        ]
        assert enqueue_many_sync(conn, plain_first) == 1
        assert enqueue_sync(conn, "t", dedupe_key="w", dedupe_window_s=60) is None
        assert enqueue_sync(conn, "t", dedupe_key="w", partition_key=b) is None
    assert fetchall(
        dsn,
        "SELECT w.dedupe_key, j.bucket FROM dispatcher_dedupe_windows AS w "
        "JOIN dispatcher_jobs AS j ON j.id = w.job_id ORDER BY 1",
    ) == [("w", bucket_for(a))]
    assert fetchall(dsn, "SELECT dedupe_key, bucket FROM dispatcher_jobs ORDER BY id") == [
        ("w", bucket_for(a)),
        ("v", bucket_for("v")),
    ]


def test_the_cli_places_a_job_by_its_dedupe_key(dsn):
    first = cli("enqueue", "t", "--dedupe-key", "cli-key", "--dsn", dsn)
    again = cli("enqueue", "t", "--dedupe-key", "cli-key", "--dsn", dsn)
    assert first.returncode == 0 and first.stdout.startswith("enqueued job "), first.stderr
    assert again.returncode == 0 and again.stdout.startswith("duplicate"), again.stderr
    assert fetchall(dsn, "SELECT dedupe_key, bucket FROM dispatcher_jobs") == [
        ("cli-key", bucket_for("cli-key"))
    ]


def test_a_keyed_batch_job_whose_dedupe_key_is_live_in_another_bucket_leaves_its_key_to_the_next(
    dsn,
):
    """A batch's keyed job whose dedupe key is live in another bucket is a duplicate (the
    queue-wide index), and the key's next job of the batch becomes its holder: never a job
    waiting behind no holder."""
    taken = {bucket_for("acct"), bucket_for("solo")}
    other = next(k for k in (f"p{n}" for n in range(100)) if bucket_for(k) not in taken)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for key in ("x", "y"):
            assert enqueue_sync(conn, "t", dedupe_key=key, partition_key=other) is not None
        specs = [
            JobSpec("t", {"n": 1}, dedupe_key="x", ordering_key="acct"),
            JobSpec("t", {"n": 2}, ordering_key="acct"),
        ]
        assert enqueue_many_sync(conn, specs) == 1
        alone = [JobSpec("t", {"n": 3}, dedupe_key="y", ordering_key="solo")]
        assert enqueue_many_sync(conn, alone) == 0
    assert fetchall(
        dsn,
        "SELECT (payload->>'n')::int, status, bucket FROM dispatcher_jobs "
        "WHERE ordering_key IS NOT NULL ORDER BY 1",
    ) == [(2, "queued", bucket_for("acct"))]
