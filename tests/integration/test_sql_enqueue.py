"""dispatcher_enqueue(...), the SQL function of migration 0018 (docs/guides/sql-enqueue.md): the
same bucket as Python for the same key, the same checks, rows and wake-ups as Python's enqueue,
in a trigger and in a plain transaction, run by a real worker in both modes, and callable by the
workers' role once `dispatcher grants` ran."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from dispatcher import Config, Job, Registry, Worker, enqueue_sync
from dispatcher.api.enqueue_checks import (
    MAX_ATTEMPTS,
    MAX_DEDUPE_KEY_CHARS,
    MAX_DELAY_S,
    MAX_ORDERING_KEY_CHARS,
    MAX_PRIORITY,
    MAX_TAGS,
    MIN_PAYLOAD_BYTES,
    MIN_PRIORITY,
)
from dispatcher.api.enqueue_prepare import _pick_bucket, bucket_for
from dispatcher.constants import DEFAULT_MAX_ATTEMPTS, NOTIFY_CHANNEL, NUM_BUCKETS
from dispatcher.errors import EnqueueError, PayloadError
from dispatcher.settings.defaults import DEFAULT_MAX_PAYLOAD_BYTES
from tests.helpers import Deadline, fetchall, fetchval, run_async, wait_until_async
from tests.integration.test_privileges import dml_role, grant

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "sql-enqueue.md"

# The function's parameters and their SQL types: calls below name every argument they give.
TYPES = {
    "job_type": "text",
    "payload": "jsonb",
    "queue": "text",
    "priority": "integer",
    "run_at": "timestamptz",
    "delay_s": "double precision",
    "max_attempts": "integer",
    "partition_key": "text",
    "ordering_key": "text",
    "dedupe_key": "text",
    "bucket": "integer",
    "tags": "text[]",
    "max_payload_bytes": "bigint",
}


def call(**args: Any) -> tuple[sql.Composed, dict[str, Any]]:
    """SELECT dispatcher_enqueue(name => %(name)s::type, ...) and its parameters."""
    named = sql.SQL(", ").join(
        sql.SQL("{} => {}::{}").format(
            sql.Identifier(name), sql.Placeholder(name), sql.SQL(TYPES[name])
        )
        for name in args
    )
    params = {k: Jsonb(v) if k == "payload" and v is not None else v for k, v in args.items()}
    return sql.SQL("SELECT dispatcher_enqueue({})").format(named), params


def sql_enqueue(conn: psycopg.Connection[Any], job_type: Any, **args: Any) -> int | None:
    statement, params = call(job_type=job_type, **args)
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def job_rows(dsn: str) -> list[tuple[Any, ...]]:
    return fetchall(
        dsn,
        """SELECT id, queue_name, job_type, payload, priority, bucket, max_attempts,
                  max_attempts_given, status, dedupe_key, ordering_key, tags
             FROM dispatcher_jobs ORDER BY id""",
    )


def keys(n: int) -> list[str]:
    """`n` keys: the empty one, ASCII of every length up to 40, and non-ASCII ones of 2-, 3- and
    4-byte UTF-8 characters (no surrogates: they have no UTF-8; no NUL: a text cannot hold it)."""
    rng = random.Random(39)
    ranges = [(0x20, 0x7F), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)]
    found = ["", "a", "customer:42", "é", "日本語", "🙂"]
    while len(found) < n:
        if rng.random() < 0.5:
            found.append("".join(chr(rng.randrange(0x21, 0x7F)) for _ in range(rng.randrange(41))))
        else:
            found.append(
                "".join(
                    chr(rng.randrange(*rng.choice(ranges))) for _ in range(rng.randrange(1, 20))
                )
            )
    return found


def test_the_bucket_of_10000_keys_is_pythons(dsn):
    given = keys(10_000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = conn.execute(
            "SELECT array_agg(dispatcher_bucket_for(k) ORDER BY n) "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS t(k, n)",
            (given,),
        ).fetchone()
        assert conn.execute("SELECT dispatcher_bucket_for(NULL)").fetchone() == (None,)
    assert got is not None
    wrong = [
        (k, b, bucket_for(k)) for k, b in zip(given, got[0], strict=True) if b != bucket_for(k)
    ]
    assert not wrong, wrong[:10]
    assert len({bucket_for(k) for k in given}) == NUM_BUCKETS


def test_the_bucket_is_picked_as_python_picks_it(dsn):
    """Ordering key, bucket, partition key, dedupe key, chance: the first one given wins."""
    combos: list[dict[str, Any]] = [
        {"ordering_key": "o1"},
        {"ordering_key": "o1", "partition_key": "o1"},
        {"ordering_key": "o1", "bucket": bucket_for("o1")},
        {"ordering_key": "o2", "dedupe_key": "d2"},
        {"bucket": 7, "dedupe_key": "d3"},
        {"partition_key": "p1", "dedupe_key": "d4"},
        {"partition_key": ""},
        {"dedupe_key": "d5"},
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, combo in enumerate(combos):
            job_id = sql_enqueue(conn, "a", queue=f"q{i}", **combo)
            placed = fetchval(dsn, "SELECT bucket FROM dispatcher_jobs WHERE id = %s", (job_id,))
            expected = _pick_bucket(
                combo.get("bucket"),
                combo.get("partition_key"),
                combo.get("ordering_key"),
                combo.get("dedupe_key"),
            )
            assert placed == expected, combo
        chance = {sql_enqueue(conn, "a", queue="chance") for _ in range(200)}
    buckets = fetchall(
        dsn, "SELECT DISTINCT bucket FROM dispatcher_jobs WHERE id = ANY(%s)", (list(chance),)
    )
    assert len(buckets) > 40  # 200 draws leave one of 64 buckets empty with odds ~ 2e-1 each


def test_a_job_is_the_row_python_writes(dsn):
    run_at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    options: dict[str, Any] = {
        "queue": "mail",
        "priority": -3,
        "run_at": run_at,
        "max_attempts": 4,
        "partition_key": "customer:7",
        "tags": ["vip", "region:eu", "vip"],
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        from_sql = sql_enqueue(conn, "send", payload={"to": "a", "n": [1, 2]}, **options)
        from_python = enqueue_sync(conn, "send", {"to": "a", "n": [1, 2]}, **options)
        defaults_sql = sql_enqueue(conn, "bare")
        defaults_python = enqueue_sync(conn, "bare")
        null_payload = sql_enqueue(conn, "bare", payload=None)
        json_null = conn.execute("SELECT dispatcher_enqueue('bare', 'null'::jsonb)").fetchone()
        no_tags = sql_enqueue(conn, "bare", tags=[])
        no_tags_python = enqueue_sync(conn, "bare", tags=[])
    rows = {row[0]: row[1:] for row in job_rows(dsn)}
    assert rows[from_sql] == rows[from_python]
    assert rows[from_sql][:5] == (
        "mail",
        "send",
        {"to": "a", "n": [1, 2]},
        -3,
        bucket_for("customer:7"),
    )
    assert fetchall(
        dsn,
        "SELECT DISTINCT run_at FROM dispatcher_jobs WHERE id = ANY(%s)",
        ([from_sql, from_python],),
    ) == [(run_at,)]
    # the defaults, but the bucket (random)
    assert rows[defaults_sql][:4] + rows[defaults_sql][5:] == (
        rows[defaults_python][:4] + rows[defaults_python][5:]
    )
    assert rows[defaults_sql][:4] == ("default", "bare", {}, 0)
    assert rows[defaults_sql][5:7] == (DEFAULT_MAX_ATTEMPTS, False)
    assert json_null is not None
    assert rows[null_payload][2] == rows[json_null[0]][2] == {}
    assert rows[from_sql][-1] == ["vip", "region:eu"]  # duplicates dropped, in the order given
    assert rows[no_tags][-1] is rows[no_tags_python][-1] is None


def test_a_dedupe_key_held_by_a_live_job_returns_null_on_both_sides(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = sql_enqueue(conn, "a", dedupe_key="report:42")
        assert first is not None
        assert sql_enqueue(conn, "a", dedupe_key="report:42") is None
        assert enqueue_sync(conn, "a", dedupe_key="report:42") is None
        assert sql_enqueue(conn, "a", dedupe_key="report:42", queue="other") is not None
        python_first = enqueue_sync(conn, "a", dedupe_key="other:1")
        assert python_first is not None
        assert sql_enqueue(conn, "a", dedupe_key="other:1") is None
        # the key is free again once its job is no longer live (completed, as a worker leaves it)
        conn.execute("UPDATE dispatcher_jobs SET status = 'completed' WHERE id = %s", (first,))
        again = sql_enqueue(conn, "a", dedupe_key="report:42")
    assert again is not None and again > first
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE status = 'queued'") == 3


def test_an_ordering_keys_second_job_waits_whichever_side_enqueued_the_first(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        a1 = sql_enqueue(conn, "a", ordering_key="acct:1")
        a2 = sql_enqueue(conn, "a", ordering_key="acct:1")
        a3 = enqueue_sync(conn, "a", ordering_key="acct:1")
        b1 = enqueue_sync(conn, "a", ordering_key="acct:2")
        b2 = sql_enqueue(conn, "a", ordering_key="acct:2")
        other_queue = sql_enqueue(conn, "a", ordering_key="acct:1", queue="q2")
        # a keyed duplicate is refused as Python refuses it
        assert sql_enqueue(conn, "a", ordering_key="acct:3", dedupe_key="d") is not None
        assert sql_enqueue(conn, "a", ordering_key="acct:3", dedupe_key="d") is None
    status = dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs"))
    assert [status[i] for i in (a1, a2, a3, b1, b2, other_queue)] == [
        "queued",
        "waiting",
        "waiting",
        "queued",
        "waiting",
        "queued",
    ]
    assert fetchall(
        dsn, "SELECT DISTINCT bucket FROM dispatcher_jobs WHERE ordering_key = 'acct:1'"
    ) == [(bucket_for("acct:1"),)]


def test_bounds_are_pythons(dsn):
    """Each bound of enqueue_checks.py is accepted at its edge (and refused past it: below)."""
    payload = {"a": "x" * (DEFAULT_MAX_PAYLOAD_BYTES - len('{"a": ""}'))}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for args in (
            {"priority": MIN_PRIORITY},
            {"priority": MAX_PRIORITY},
            {"max_attempts": 1},
            {"max_attempts": MAX_ATTEMPTS},
            {"delay_s": MAX_DELAY_S},
            {"bucket": 0},
            {"bucket": NUM_BUCKETS - 1},
            {"ordering_key": "é" * MAX_ORDERING_KEY_CHARS},
            {"dedupe_key": "日" * MAX_DEDUPE_KEY_CHARS},
            {"payload": {}, "max_payload_bytes": MIN_PAYLOAD_BYTES},
            {"payload": payload},
            {"queue": "A-z_0.9" + "q" * 93},
            {"tags": [f"{i:0>64}" for i in range(MAX_TAGS)]},
            {"tags": ["A-z_0.9:" + "t" * 56]},
        ):
            assert sql_enqueue(conn, "a", **args) is not None, args
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="payload is 1048577 bytes"):
            sql_enqueue(conn, "a", payload={"a": payload["a"] + "x"})


RUN_AT = datetime(2031, 1, 1, tzinfo=UTC)

# (the function's arguments, Python's enqueue keywords or None where Python has no such value,
# the parameter the error names)
BAD: list[tuple[dict[str, Any], dict[str, Any] | None, str]] = [
    ({"job_type": "a b"}, {"job_type": "a b"}, "job_type"),
    ({"job_type": ""}, {"job_type": ""}, "job_type"),
    ({"job_type": None}, {"job_type": None}, "job_type"),
    ({"job_type": "x" * 101}, {"job_type": "x" * 101}, "job_type"),
    ({"queue": "q\n"}, {"queue": "q\n"}, "queue"),
    ({"queue": "é"}, {"queue": "é"}, "queue"),
    ({"queue": None}, {"queue": None}, "queue"),
    ({"priority": MAX_PRIORITY + 1}, {"priority": MAX_PRIORITY + 1}, "priority"),
    ({"priority": MIN_PRIORITY - 1}, {"priority": MIN_PRIORITY - 1}, "priority"),
    ({"priority": None}, {"priority": None}, "priority"),
    ({"max_attempts": 0}, {"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": MAX_ATTEMPTS + 1}, {"max_attempts": MAX_ATTEMPTS + 1}, "max_attempts"),
    ({"delay_s": -1}, {"delay_s": -1}, "delay_s"),
    ({"delay_s": MAX_DELAY_S + 1}, {"delay_s": MAX_DELAY_S + 1}, "delay_s"),
    ({"delay_s": float("nan")}, {"delay_s": float("nan")}, "delay_s"),
    ({"delay_s": float("inf")}, {"delay_s": float("inf")}, "delay_s"),
    ({"delay_s": None}, {"delay_s": None}, "delay_s"),
    ({"run_at": RUN_AT, "delay_s": 5}, {"run_at": RUN_AT, "delay_s": 5}, "run_at"),
    ({"bucket": NUM_BUCKETS}, {"bucket": NUM_BUCKETS}, "bucket"),
    ({"bucket": -1}, {"bucket": -1}, "bucket"),
    ({"bucket": 3, "partition_key": "p"}, {"bucket": 3, "partition_key": "p"}, "bucket"),
    ({"dedupe_key": ""}, {"dedupe_key": ""}, "dedupe_key"),
    (
        {"dedupe_key": "x" * (MAX_DEDUPE_KEY_CHARS + 1)},
        {"dedupe_key": "x" * (MAX_DEDUPE_KEY_CHARS + 1)},
        "dedupe_key",
    ),
    ({"ordering_key": ""}, {"ordering_key": ""}, "ordering_key"),
    (
        {"ordering_key": "é" * (MAX_ORDERING_KEY_CHARS + 1)},
        {"ordering_key": "é" * (MAX_ORDERING_KEY_CHARS + 1)},
        "ordering_key",
    ),
    (
        {"ordering_key": "o1", "bucket": (bucket_for("o1") + 1) % NUM_BUCKETS},
        {"ordering_key": "o1", "bucket": (bucket_for("o1") + 1) % NUM_BUCKETS},
        "bucket",
    ),
    (
        {"ordering_key": "o1", "partition_key": "p-elsewhere"},
        {"ordering_key": "o1", "partition_key": "p-elsewhere"},
        "partition_key",
    ),
    (
        {"payload": {"a": "x" * 20}, "max_payload_bytes": 10},
        {"payload": {"a": "x" * 20}},
        "payload",
    ),
    ({"max_payload_bytes": MIN_PAYLOAD_BYTES - 1}, {"max_payload_bytes": 1}, "max_payload_bytes"),
    ({"max_payload_bytes": None}, {"max_payload_bytes": None}, "max_payload_bytes"),
    ({"tags": [""]}, {"tags": [""]}, "tags"),
    ({"tags": ["a", None]}, {"tags": ["a", None]}, "tags"),
    ({"tags": ["t" * 65]}, {"tags": ["t" * 65]}, "tags"),
    ({"tags": ["a b"]}, {"tags": ["a b"]}, "tags"),
    ({"tags": ["a,b"]}, {"tags": ["a,b"]}, "tags"),
    ({"tags": ["é"]}, {"tags": ["é"]}, "tags"),
    (
        {"tags": [f"t{i}" for i in range(MAX_TAGS + 1)]},
        {"tags": [f"t{i}" for i in range(MAX_TAGS + 1)]},
        "tags",
    ),
    ({"tags": [["a"], ["b"]]}, None, "tags"),
]


@pytest.mark.parametrize(
    ("args", "python", "option"), BAD, ids=[f"{i}-{case[2]}" for i, case in enumerate(BAD)]
)
def test_bad_input_raises_naming_its_parameter_and_writes_nothing(dsn, args, python, option):
    statement, params = call(**{"job_type": "a", **args})
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
            conn.execute(statement, params)
        conn.rollback()
    error = raised.value
    assert error.diag.column_name == option
    assert error.diag.message_primary is not None
    assert re.match(rf"dispatcher_enqueue: .*\b{option}\b", error.diag.message_primary), (
        error.diag.message_primary
    )
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0
    if python is not None:  # Python refuses the same value, naming the same option
        python = {"job_type": "a", **python}
        with (
            psycopg.connect(dsn, autocommit=True) as conn,
            pytest.raises((EnqueueError, PayloadError)) as refused,
        ):
            enqueue_sync(
                conn,
                python.pop("job_type"),
                python.pop("payload", None),
                max_payload_bytes=python.pop(
                    "max_payload_bytes",
                    10 if option == "payload" else DEFAULT_MAX_PAYLOAD_BYTES,
                ),
                **python,
            )
        assert getattr(refused.value, "option", "payload") == option


def test_an_infinite_run_at_which_python_cannot_hold_is_refused_too(dsn):
    with (
        psycopg.connect(dsn) as conn,
        pytest.raises(psycopg.errors.InvalidParameterValue, match="run_at must be finite"),
    ):
        conn.execute("SELECT dispatcher_enqueue('a', run_at => 'infinity')")
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0


def guide_trigger() -> str:
    """The guide's trigger example, as it is printed there."""
    blocks = re.findall(r"```sql\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    (block,) = [b for b in blocks if "CREATE TRIGGER" in b]
    return block


def test_the_guides_trigger_enqueues_in_the_inserting_transaction_or_not_at_all(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(guide_trigger().encode())  # bytes: a multi-statement script
    with psycopg.connect(dsn) as conn:
        order_id = conn.execute(
            "INSERT INTO orders (customer, total) VALUES ('ada', 12.5) RETURNING id"
        ).fetchone()
        # not committed: no job for anyone else yet
        assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0
        conn.commit()

        conn.execute("INSERT INTO orders (customer, total) VALUES ('bob', 1)")
        conn.rollback()

        # a bad value in the call fails the INSERT itself: no order, no job
        with pytest.raises(
            psycopg.errors.InvalidParameterValue, match="ordering_key must be 1 to 500"
        ):
            conn.execute("INSERT INTO orders (customer, total) VALUES (%s, 1)", ("c" * 500,))
        conn.rollback()

        # a second order of the same customer waits behind the first
        second = conn.execute(
            "INSERT INTO orders (customer, total) VALUES ('ada', 3) RETURNING id"
        ).fetchone()
        conn.commit()
    assert order_id is not None and second is not None
    assert fetchall(dsn, "SELECT customer FROM orders ORDER BY id") == [("ada",), ("ada",)]
    assert fetchall(
        dsn,
        "SELECT queue_name, job_type, payload, ordering_key, dedupe_key, status, bucket "
        "FROM dispatcher_jobs ORDER BY id",
    ) == [
        (
            "orders",
            "order_confirmation",
            {"order_id": order_id[0], "total": 12.5},
            "customer:ada",
            f"order:{order_id[0]}",
            "queued",
            bucket_for("customer:ada"),
        ),
        (
            "orders",
            "order_confirmation",
            {"order_id": second[0], "total": 3},
            "customer:ada",
            f"order:{second[0]}",
            "waiting",
            bucket_for("customer:ada"),
        ),
    ]


def test_a_caller_with_another_search_path_calls_it_by_its_qualified_name(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA elsewhere")
        conn.execute("SET search_path = elsewhere")
        row = conn.execute(
            "SELECT public.dispatcher_enqueue('a', ordering_key => 'k'), "
            "public.dispatcher_enqueue('a', ordering_key => 'k')"
        ).fetchone()
    assert row is not None and None not in row
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 2


def collect_notifications(listener: psycopg.Connection[Any], until: str) -> list[str]:
    """The payloads on NOTIFY_CHANNEL up to the one equal to `until` (sent last, so every
    notification sent before it has arrived: they come in commit order)."""
    got: list[str] = []
    deadline = Deadline(10)
    while until not in got:
        if deadline.passed():
            raise deadline.timed_out(f"{until!r} after {got}")
        got += [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)]
    return got[: got.index(until)]


def test_the_wake_up_is_python_enqueues_and_none_for_a_waiting_job_or_a_rollback(dsn):
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
        sql_enqueue(conn, "a", bucket=5)
        enqueue_sync(conn, "a", bucket=5)
        sql_enqueue(conn, "a", bucket=6, delay_s=60)
        enqueue_sync(conn, "a", bucket=6, delay_s=60)
        sql_enqueue(conn, "a", queue="keyed", ordering_key="k")  # the key's holder: woken
        sql_enqueue(conn, "a", queue="keyed", ordering_key="k")  # waits behind it: not woken
        sql_enqueue(conn, "a", queue="dup", dedupe_key="d", bucket=1)
        sql_enqueue(conn, "a", queue="dup", dedupe_key="d", bucket=1)  # a duplicate: not woken
        with conn.transaction(force_rollback=True):
            sql_enqueue(conn, "a", queue="rolledback", bucket=1)
        enqueue_sync(conn, "a", queue="sentinel", bucket=0)
        got = collect_notifications(listener, "sentinel:0")
    assert got[:2] == ["default:5", "default:5"]
    delayed = [re.fullmatch(r"default:6:(\d+)", p) for p in got[2:4]]
    assert all(m and 55_000 < int(m[1]) <= 60_000 for m in delayed), got
    assert got[4:] == [f"keyed:{bucket_for('k')}", "dup:1"]


def ready(worker: Worker) -> bool:
    """Listening, owning every bucket (partitioned mode) and asleep with no wake-up pending."""
    return (
        worker.listening.is_set()
        and all(len(a.owned() or ()) == NUM_BUCKETS for a in worker.assignments.values())
        and worker.idle
    )


@pytest.mark.parametrize("mode", ["partitioned", "skip_locked"])
def test_a_worker_woken_by_its_notification_runs_the_jobs_and_a_keys_jobs_in_order(dsn, mode):
    """Poll interval 30 s: only the function's NOTIFY explains a pick-up within seconds."""
    registry = Registry()
    runs: list[tuple[int, str, Any, float, float]] = []

    @registry.handler("ping")
    async def ping(job: Job) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.02)
        runs.append((job.id, job.queue, job.payload, start, time.monotonic()))

    worker = Worker(
        Config(dsn=dsn, mode=mode, poll_interval_s=30, flush_interval_s=0.01).replace(), registry
    )

    async def main() -> tuple[Any, list[Any]]:
        task = asyncio.create_task(worker.run())
        try:
            await wait_until_async(lambda: ready(worker), 15, "the worker ready and idle")
            handled = Deadline(10)
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                async with conn.transaction():
                    cur = await conn.execute(
                        "SELECT dispatcher_enqueue('ping', '{\"n\": 1}', priority => 2)"
                    )
                    single = await cur.fetchone()
                await wait_until_async(lambda: runs, handled, "the job run", interval_s=0.01)
                async with conn.transaction():
                    keyed = []
                    for n in range(3):
                        cur = await conn.execute(
                            "SELECT dispatcher_enqueue('ping', jsonb_build_object('n', %s::int),"
                            " queue => 'default', ordering_key => 'acct:9')",
                            (n,),
                        )
                        keyed.append(await cur.fetchone())
                await wait_until_async(
                    lambda: len(runs) == 4, handled, "the key's three jobs run", interval_s=0.01
                )
            return single, keyed
        finally:
            worker.stop()
            await task

    single, keyed = run_async(main())
    assert [r[:3] for r in runs[:1]] == [(single[0], "default", {"n": 1})]
    assert [(r[0],) for r in runs[1:]] == keyed  # in enqueue order
    assert [r[2] for r in runs[1:]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(a[4] <= b[3] for a, b in itertools.pairwise(runs[1:]))  # one at a time
    assert fetchall(dsn, "SELECT DISTINCT status FROM dispatcher_jobs") == [("completed",)]


def test_the_workers_role_calls_it_once_granted(dsn):
    with contextlib.contextmanager(dml_role)(dsn) as (role, role_dsn):
        with (
            psycopg.connect(role_dsn, autocommit=True) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="dispatcher_enqueue"),
        ):
            sql_enqueue(conn, "a")
        grant(dsn, role)
        with psycopg.connect(role_dsn, autocommit=True) as conn:
            plain = sql_enqueue(conn, "a", dedupe_key="k")
            keyed = sql_enqueue(conn, "a", ordering_key="o")
            bucket = conn.execute("SELECT dispatcher_bucket_for('o')").fetchone()
        assert plain is not None and keyed is not None
        assert bucket == (bucket_for("o"),)
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 2
