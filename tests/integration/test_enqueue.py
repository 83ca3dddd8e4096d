import datetime as dt

import orjson
import psycopg
import psycopg_pool
import pytest

from dispatcher import (
    EnqueueError,
    JobSpec,
    PayloadError,
    enqueue,
    enqueue_many,
    enqueue_many_sync,
    enqueue_payloads,
    enqueue_payloads_sync,
    enqueue_sync,
)
from dispatcher.api.enqueue import bucket_for
from tests.helpers import fetchall, fetchval, run_async


def count(dsn):
    return fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs")


def test_enqueue_joins_the_callers_transaction(dsn):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with conn.transaction(force_rollback=True):
                await enqueue(conn, "a", {"x": 1})
                await enqueue_many(conn, [JobSpec("b"), JobSpec("c")])
                assert (
                    await (await conn.execute("SELECT count(*) FROM dispatcher_jobs")).fetchone()
                )[0] == 3
            assert count(dsn) == 0  # rolled back: no job exists
            async with conn.transaction():
                job_id = await enqueue(conn, "a", {"x": 1})
                assert count(dsn) == 0  # not visible before the caller commits
            assert fetchval(
                dsn, "SELECT payload FROM dispatcher_jobs WHERE id = %s", (job_id,)
            ) == {"x": 1}

    run_async(main())


def test_sync_enqueue_in_a_rolled_back_transaction_leaves_nothing(dsn):
    with psycopg.connect(dsn) as conn:
        enqueue_sync(conn, "a")
        enqueue_payloads_sync(conn, "b", [{}, {}])
        conn.rollback()
    assert count(dsn) == 0


def test_a_bulk_enqueue_as_the_first_statement_of_a_transaction_commits_only_with_it(dsn):
    """Outside autocommit, a connection that has sent nothing yet (as inside Django's atomic) has
    no transaction begun: the bulk enqueue must begin the caller's, not commit one of its own."""
    with psycopg.connect(dsn) as conn:
        assert enqueue_many_sync(conn, [JobSpec("a"), JobSpec("b")]) == 2
        assert count(dsn) == 0, "not visible before the caller commits"
        conn.rollback()
        enqueue_payloads_sync(conn, "c", [{}] * 3)
        conn.rollback()
    assert count(dsn) == 0

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await enqueue_many(conn, [JobSpec("d")])
            await enqueue_payloads(conn, "e", [{}, {}])
            await conn.rollback()
            await enqueue_many(conn, [JobSpec("f")])
            await conn.commit()

    run_async(main())
    assert [row[0] for row in fetchall(dsn, "SELECT job_type FROM dispatcher_jobs")] == ["f"]
    with psycopg.connect(dsn) as conn:  # committed on leaving the block, with the caller's work
        enqueue_many_sync(conn, [JobSpec("g")])
    assert count(dsn) == 2


def test_a_bulk_load_inside_the_callers_block_on_an_autocommit_connection_stays_in_that_block(dsn):
    """An autocommit connection inside `conn.transaction()`: the jobs commit with the block or not
    at all, and the ANALYZE that follows a bulk load runs not in it (it would count rows that may
    roll back, and hold its lock until the caller commits), but only in a transaction of its own."""

    class Abandon(Exception):
        pass

    def reltuples():
        return fetchval(dsn, "SELECT reltuples FROM pg_class WHERE relname = 'dispatcher_jobs'")

    async def abandoned_async():
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
            conn.transaction(),
        ):
            assert await enqueue_payloads(conn, "b", [{}] * 6000) == 6000
            raise Abandon

    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(Abandon),
        conn.transaction(),
    ):
        assert enqueue_payloads_sync(conn, "a", [{}] * 6000) == 6000
        raise Abandon
    with pytest.raises(Abandon):
        run_async(abandoned_async())
    assert count(dsn) == 0 and reltuples() < 6000, "no ANALYZE inside the caller's block"
    with psycopg.connect(dsn, autocommit=True) as conn:  # outside any block: its own, then ANALYZE
        assert enqueue_payloads_sync(conn, "c", [{}] * 6000) == 6000
    assert count(dsn) == 6000 and reltuples() == 6000


def test_pool_enqueue_commits_on_its_own(dsn):
    async def main():
        async with psycopg_pool.AsyncConnectionPool(
            dsn, min_size=1, max_size=1, open=False
        ) as pool:
            await pool.open()
            await enqueue(pool, "a")
            await enqueue_many(pool, [JobSpec("b")] * 3)

    run_async(main())
    assert count(dsn) == 4


def test_dedupe_key_holds_for_live_jobs_only(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = enqueue_sync(conn, "a", dedupe_key="k")
        assert first is not None
        assert enqueue_sync(conn, "a", dedupe_key="k") is None
        assert enqueue_sync(conn, "a", dedupe_key="k", queue="other") is not None  # per queue
        inserted = enqueue_many_sync(
            conn,
            [
                JobSpec("a", dedupe_key="k"),
                JobSpec("a", dedupe_key="m"),
                JobSpec("a", dedupe_key="m"),
                JobSpec("a"),
            ],
        )
        assert inserted == 2  # 'k' is live, the second 'm' duplicates the first
        conn.execute("UPDATE dispatcher_jobs SET status = 'completed' WHERE id = %s", (first,))
        assert enqueue_sync(conn, "a", dedupe_key="k") is not None  # finished jobs free the key
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE dedupe_key = 'k'") == 3


@pytest.mark.parametrize(
    "payload, error",
    [({"when": object()}, "cannot be serialised"), ({"blob": "x" * 2000}, "over the limit")],
)
def test_bad_payloads_are_rejected_and_nothing_is_written(dsn, payload, error):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(PayloadError, match=error):
            enqueue_sync(conn, "a", payload, max_payload_bytes=1024)
        with pytest.raises(PayloadError, match=f"job #2.*{error}"):
            enqueue_many_sync(
                conn, [JobSpec("a"), JobSpec("a"), JobSpec("a", payload)], max_payload_bytes=1024
            )
        with pytest.raises(PayloadError, match="job #1"):
            enqueue_payloads_sync(conn, "a", [{}, payload], max_payload_bytes=1024)
    assert count(dsn) == 0


def test_a_bad_payload_deep_in_a_bulk_enqueue_rolls_back_rows_already_streamed(dsn):
    """Rows go to the server in chunks of 5,000 while later ones are still being prepared: a bad
    row at #12,000 must still leave nothing behind, in our transaction or in the caller's."""
    payloads = [{"i": i} for i in range(12_000)] + [{"bad": object()}]
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(PayloadError, match="job #12000"):
            enqueue_payloads_sync(conn, "a", payloads)
        with pytest.raises(PayloadError, match="job #12000"):
            enqueue_many_sync(conn, [JobSpec("a", p) for p in payloads])
    with psycopg.connect(dsn) as conn:
        enqueue_sync(conn, "kept")
        with pytest.raises(PayloadError):
            enqueue_payloads_sync(conn, "a", payloads)
        conn.commit()  # the caller's own work survives; the failed bulk left nothing
    assert fetchall(dsn, "SELECT job_type FROM dispatcher_jobs") == [("kept",)]


@pytest.mark.parametrize(
    "options, error",
    [
        ({"queue": "bad queue"}, "queue must match"),
        ({"bucket": 64}, "bucket must be in"),
        ({"delay_s": -1}, ">= 0"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"priority": 40000}, r"priority must be in -32768\.\.32767"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "timezone-aware"),
        ({"run_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC), "delay_s": 5}, "not both"),
    ],
)
def test_bad_options_are_clear_errors(dsn, options, error):
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(EnqueueError, match=error),
    ):
        enqueue_sync(conn, "a", **options)
    assert count(dsn) == 0


def test_partition_key_maps_to_a_stable_bucket_and_options_land(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        a = enqueue_sync(
            conn, "a", partition_key="customer-42", priority=-3, max_attempts=7, delay_s=60
        )
        enqueue_many_sync(conn, [JobSpec("a", partition_key="customer-42")] * 5)
    buckets = {b for (b,) in fetchall(dsn, "SELECT bucket FROM dispatcher_jobs")}
    assert buckets == {bucket_for("customer-42")}
    priority, max_attempts, delay = fetchall(
        dsn,
        "SELECT priority, max_attempts, extract(epoch FROM run_at - created_at) "
        "FROM dispatcher_jobs WHERE id = %s",
        (a,),
    )[0]
    assert (priority, max_attempts) == (-3, 7)
    assert 59.9 < float(delay) < 60.1


def test_jitter_spreads_run_at_over_the_window_from_the_database_clock(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "a", [{}] * 2000, jitter_s=10)
    offsets = [
        float(x)
        for (x,) in fetchall(
            dsn, "SELECT extract(epoch FROM run_at - created_at) FROM dispatcher_jobs"
        )
    ]
    assert min(offsets) >= 0 and max(offsets) <= 10
    assert min(offsets) < 1 and max(offsets) > 9  # spread, not bunched
    # roughly uniform: each of the 5 two-second slices holds 20% +- 5%
    for lo in range(0, 10, 2):
        share = sum(lo <= o < lo + 2 for o in offsets) / len(offsets)
        assert 0.15 < share < 0.25, (lo, share)


def test_bulk_enqueue_writes_every_job_with_its_payload(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        tricky = {"s": "tab\there\\back\nslash", "u": "żółw", "n": None}
        assert (
            enqueue_many_sync(
                conn, [JobSpec("a", {"i": i, **tricky}, dedupe_key=f"k\t{i}") for i in range(3)]
            )
            == 3
        )
        assert enqueue_payloads_sync(conn, "b", [{"i": i} for i in range(10_000)]) == 10_000
    assert count(dsn) == 10_003
    assert (
        fetchval(
            dsn, "SELECT count(DISTINCT payload->>'i') FROM dispatcher_jobs WHERE job_type = 'b'"
        )
        == 10_000
    )
    rows = fetchall(
        dsn, "SELECT payload, dedupe_key FROM dispatcher_jobs WHERE job_type = 'a' ORDER BY id"
    )
    assert rows[1] == ({"i": 1, **tricky}, "k\t1")


# -- the bad-input sweep: every path applies every rule, and a refusal writes nothing --------------

PATHS = [
    "enqueue",
    "enqueue_sync",
    "enqueue_many",
    "enqueue_many_sync",
    "enqueue_payloads",
    "enqueue_payloads_sync",
]
FUNCTIONS = {
    f.__name__: f
    for f in (
        enqueue,
        enqueue_sync,
        enqueue_many,
        enqueue_many_sync,
        enqueue_payloads,
        enqueue_payloads_sync,
    )
}


def enqueue_by(path, dsn, payload=None, *, max_payload_bytes=1 << 20, **options):
    """Enqueue a job carrying `payload` and `options` through `path`, on an autocommit connection
    (whatever it wrote would stay). The bulk paths get a good job first, so a refusal of the
    second must also take back a row already sent."""
    function = FUNCTIONS[path]

    def call(conn):
        if path.startswith("enqueue_many"):
            return function(
                conn,
                [JobSpec("a"), JobSpec("a", payload, **options)],
                max_payload_bytes=max_payload_bytes,
            )
        if path.startswith("enqueue_payloads"):
            return function(
                conn, "a", [{}, payload], max_payload_bytes=max_payload_bytes, **options
            )
        return function(conn, "a", payload, max_payload_bytes=max_payload_bytes, **options)

    if path.endswith("_sync"):
        with psycopg.connect(dsn, autocommit=True) as conn:
            return call(conn)

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await call(conn)

    return run_async(main())


@pytest.mark.parametrize("path", PATHS)
def test_max_payload_bytes_is_enforced_on_every_path(dsn, path):
    payload = {"customer": "c-4242", "plan": "pro-annual-42"}  # 44 bytes of JSON
    with pytest.raises(PayloadError, match="44 bytes, over the limit of 10 bytes"):
        enqueue_by(path, dsn, payload, max_payload_bytes=10)
    assert count(dsn) == 0
    enqueue_by(path, dsn, payload, max_payload_bytes=44)  # exactly at the limit: accepted
    assert (
        fetchval(
            dsn,
            "SELECT count(*) FROM dispatcher_jobs WHERE payload = %s::jsonb",
            (orjson.dumps(payload).decode(),),
        )
        == 1
    )


@pytest.mark.parametrize(
    "payload", [{"ratio": float("nan")}, {"a": None, "b": [1, {"c": float("-inf")}]}]
)
@pytest.mark.parametrize("path", PATHS)
def test_nan_or_infinity_in_a_payload_is_refused_not_stored_as_null(dsn, path, payload):
    with pytest.raises(PayloadError, match="NaN or Infinity"):
        enqueue_by(path, dsn, payload)
    assert count(dsn) == 0


@pytest.mark.parametrize("path", PATHS)
def test_a_nul_character_is_a_payload_error_not_a_database_error(dsn, path):
    with pytest.raises(PayloadError, match="NUL"):
        enqueue_by(path, dsn, {"note": "a\x00b"})
    assert count(dsn) == 0


@pytest.mark.parametrize(
    "option, value",
    [
        ("delay_s", float("nan")),
        ("delay_s", float("inf")),
        ("jitter_s", float("nan")),
        ("jitter_s", float("inf")),
        ("delay_s", 1e300),
        ("max_attempts", 1.5),
        ("max_attempts", True),
        ("priority", 2.5),
    ],
)
@pytest.mark.parametrize("path", PATHS)
def test_non_finite_times_and_non_integer_counts_are_enqueue_errors(dsn, path, option, value):
    """Not a raw ValueError/OverflowError from the COPY path, not a database error, and not a
    silently rounded value (max_attempts=1.5 used to be stored as 2)."""
    with pytest.raises(EnqueueError) as info:
        enqueue_by(path, dsn, {}, **{option: value})
    assert info.value.option == option and option in str(info.value)
    assert count(dsn) == 0


@pytest.mark.parametrize("key", ["", "k" * 3000, "a\x00b"])
@pytest.mark.parametrize("path", ["enqueue_sync", "enqueue_many_sync", "enqueue_many"])
def test_a_bad_dedupe_key_is_an_enqueue_error_and_nothing_is_written(dsn, path, key):
    """Not a StoreError from PostgreSQL (a btree entry over 2,704 bytes, a NUL in text) and not
    an empty key that every job given "" shares: refused before anything is sent, with the index
    of the job in bulk; the good job before it is not written either."""
    with pytest.raises(EnqueueError) as info:
        enqueue_by(path, dsn, {}, dedupe_key=key)
    assert info.value.option == "dedupe_key"
    assert ("job #1" in str(info.value)) == path.startswith("enqueue_many")
    assert count(dsn) == 0
