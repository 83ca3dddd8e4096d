"""Uniqueness windows (`dedupe_window_s`) on PostgreSQL: a key stays held after its job finished,
whatever became of the job's row, until the window passes; one enqueuer wins however many race."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from dispatcher import JobSpec, enqueue_many_sync, enqueue_sync
from dispatcher.admin import Filters, cancel_jobs, purge_jobs
from dispatcher.constants import COMPLETED_DELETE, COMPLETED_KEEP
from dispatcher.db.rows import Failure
from dispatcher.db.store import JobStore
from dispatcher.model import STATUS_FAILED, Outcome
from dispatcher.runtime.janitor import prune_round
from tests.helpers import fetchall, fetchval, run_async, wait_until

HOUR_S = 3600.0


def _enqueue(dsn: str, key: str, window_s: float | None = HOUR_S, **options: Any) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return enqueue_sync(conn, "send", {}, dedupe_key=key, dedupe_window_s=window_s, **options)


def _jobs_with(dsn: str, key: str) -> list[int]:
    return [
        r[0]
        for r in fetchall(
            dsn, "SELECT id FROM dispatcher_jobs WHERE dedupe_key = %s ORDER BY id", (key,)
        )
    ]


def _run_to_end(dsn: str, how: str, completed_jobs: str = COMPLETED_KEEP) -> None:
    """Claim every due job and end it: completed, or failed for good."""

    async def main() -> None:
        store = JobStore(dsn, "w", completed_jobs=completed_jobs)
        try:
            jobs = (await store.jobs_claim("default", 100, 30.0, None)).jobs
            assert jobs, "nothing to claim"
            if how == "completed":
                assert (
                    await store.jobs_complete([j.id for j in jobs], [j.token for j in jobs])
                ).completed == len(jobs)
            else:
                failed = Outcome(STATUS_FAILED, 0.0, "boom")
                assert len(
                    await store.jobs_fail_owned([Failure(j.id, j.token, failed) for j in jobs])
                ) == len(jobs)
        finally:
            await store.close()

    run_async(main())


def _prune(dsn: str, retention_s: float) -> None:
    async def main() -> None:
        store = JobStore(dsn, "janitor")
        try:
            await prune_round(store, {"completed": retention_s, "failed": retention_s}, 1000, 20)
        finally:
            await store.close()

    run_async(main())


ENDINGS: dict[str, Callable[[str, int], None]] = {
    "completed": lambda dsn, job_id: _run_to_end(dsn, "completed"),
    "failed": lambda dsn, job_id: _run_to_end(dsn, "failed"),
    "cancelled": lambda dsn, job_id: cancel_jobs(dsn, Filters(ids=(job_id,))),
    "deleted at completion": lambda dsn, job_id: _run_to_end(dsn, "completed", COMPLETED_DELETE),
    "completed, then purged": lambda dsn, job_id: (
        _run_to_end(dsn, "completed"),
        purge_jobs(dsn, Filters(ids=(job_id,))),
    ),
    "failed, then pruned": lambda dsn, job_id: (_run_to_end(dsn, "failed"), _prune(dsn, 0.0)),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_duplicate_is_refused_while_live_and_within_the_window_after_the_job_ended(dsn, ending):
    first = _enqueue(dsn, "order-1")
    assert first is not None
    assert _enqueue(dsn, "order-1") is None, "live"
    ENDINGS[ending](dsn, first)
    assert (
        fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE status IN ('queued', 'running')")
        == 0
    )
    assert _enqueue(dsn, "order-1") is None, f"{ending} within the window"
    assert _jobs_with(dsn, "order-1") in ([first], [])
    # Without a window, enqueue is what it always was: only a live job holds the key.
    assert _enqueue(dsn, "order-1", None) is not None


@pytest.mark.parametrize("ending", ["completed", "deleted at completion", "completed, then purged"])
def test_the_window_counts_from_when_the_job_finished_and_a_duplicate_goes_in_once_it_passed(
    dsn, ending
):
    window_s = 1.0
    first = _enqueue(dsn, "sync-7", window_s, delay_s=0.0)
    assert first is not None
    ENDINGS[ending](dsn, first)
    finished = fetchval(
        dsn,
        "SELECT coalesce(j.updated_at, w.finished_at) FROM dispatcher_dedupe_windows AS w "
        "LEFT JOIN dispatcher_jobs AS j ON j.id = w.job_id WHERE w.dedupe_key = 'sync-7'",
    )
    assert finished is not None, "the window knows when its job finished"

    def attempt() -> int | None:
        job_id = _enqueue(dsn, "sync-7", window_s)
        after = fetchval(dsn, "SELECT clock_timestamp()")
        if job_id is None:
            return None
        assert after >= finished + timedelta(seconds=window_s), "accepted before the window passed"
        return job_id

    second = wait_until(attempt, 20.0, "a duplicate accepted once the window passed")
    assert second != first and _enqueue(dsn, "sync-7", window_s) is None, (
        "the new job holds the key again"
    )


def test_a_window_counts_from_the_end_not_from_the_enqueue(dsn):
    """A job that ran longer than its window still holds the key for the whole window after it
    ended."""
    first = _enqueue(dsn, "long-run", 1.0)
    assert first is not None
    with psycopg.connect(dsn, autocommit=True) as conn:  # enqueued long ago, finished just now
        conn.execute(
            "UPDATE dispatcher_dedupe_windows SET enqueued_at = enqueued_at - interval '1 hour'"
        )
        conn.execute("UPDATE dispatcher_jobs SET created_at = created_at - interval '1 hour'")
    ENDINGS["deleted at completion"](dsn, first)
    assert fetchval(
        dsn, "SELECT finished_at > now() - interval '1 minute' FROM dispatcher_dedupe_windows"
    )
    assert _enqueue(dsn, "long-run", 1.0) is None or fetchval(
        dsn,
        "SELECT clock_timestamp() >= finished_at + interval '1 second' "
        "FROM dispatcher_dedupe_windows",
    )


def test_keys_and_queues_are_apart_and_a_non_windowed_live_job_holds_the_key_too(dsn):
    assert _enqueue(dsn, "a") is not None
    assert _enqueue(dsn, "b") is not None
    assert _enqueue(dsn, "a", queue="other") is not None
    assert _enqueue(dsn, "plain", None) is not None
    assert _enqueue(dsn, "plain") is None, "a live job without a window holds its key"
    assert (
        fetchval(dsn, "SELECT count(*) FROM dispatcher_dedupe_windows WHERE dedupe_key = 'plain'")
        == 0
    )


def test_bulk_enqueue_refuses_duplicates_inside_the_batch_and_against_held_windows(dsn):
    held = _enqueue(dsn, "held")
    assert held is not None
    _run_to_end(dsn, "completed")
    specs = [
        JobSpec("send", {"n": n}, dedupe_key=key, dedupe_window_s=HOUR_S)
        for n, key in enumerate(["held", "x", "x", "y", "held", "y", "z"])
    ]
    specs.append(JobSpec("send", {"n": 7}, dedupe_key="plain"))
    # behind a plain one
    specs.append(JobSpec("send", {"n": 8}, dedupe_key="plain", dedupe_window_s=HOUR_S))
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert enqueue_many_sync(conn, specs) == 4  # x, y, z (the first of each), plain
    rows = fetchall(
        dsn,
        "SELECT dedupe_key, payload->>'n', dedupe_window_s FROM dispatcher_jobs "
        "WHERE status = 'queued' ORDER BY id",
    )
    assert rows == [
        ("x", "1", HOUR_S),
        ("y", "3", HOUR_S),
        ("z", "6", HOUR_S),
        ("plain", "7", None),
    ]
    windows = dict(fetchall(dsn, "SELECT dedupe_key, job_id FROM dispatcher_dedupe_windows"))
    assert set(windows) == {"held", "x", "y", "z"} and windows["held"] == held
    with psycopg.connect(dsn, autocommit=True) as conn:  # and the batch's windows hold the next one
        assert enqueue_many_sync(conn, specs) == 0


def test_bulk_enqueue_with_ordering_keys_honours_windows(dsn):
    first = _enqueue(dsn, "k1", ordering_key="customer-1")
    assert first is not None
    specs = [
        JobSpec("send", {"n": n}, dedupe_key=key, dedupe_window_s=HOUR_S, ordering_key="customer-1")
        for n, key in enumerate(["k1", "k2", "k2", "k3"])
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert enqueue_many_sync(conn, specs) == 2
    assert fetchall(dsn, "SELECT dedupe_key, status FROM dispatcher_jobs ORDER BY id") == [
        ("k1", "queued"),
        ("k2", "waiting"),
        ("k3", "waiting"),
    ]
    assert set(dict(fetchall(dsn, "SELECT dedupe_key, job_id FROM dispatcher_dedupe_windows"))) == {
        "k1",
        "k2",
        "k3",
    }


def test_a_window_survives_in_the_callers_transaction_only_if_it_commits(dsn):
    with psycopg.connect(dsn) as conn:
        assert enqueue_sync(conn, "send", {}, dedupe_key="tx", dedupe_window_s=HOUR_S) is not None
        conn.rollback()
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_dedupe_windows") == 0
    assert _enqueue(dsn, "tx") is not None


def test_the_pruner_deletes_ended_windows_and_keeps_the_others(dsn):
    for key in ("ended", "recent", "live"):
        assert _enqueue(dsn, key, 1.0 if key == "ended" else HOUR_S) is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'completed', updated_at = now() - interval '1 "
            "minute' WHERE dedupe_key IN ('ended', 'recent')"
        )
        conn.execute(
            "UPDATE dispatcher_dedupe_windows SET prune_after = now() - interval '1 second'"
        )
    _prune(dsn, HOUR_S)
    rows = dict(
        fetchall(dsn, "SELECT dedupe_key, prune_after > now() FROM dispatcher_dedupe_windows")
    )
    assert rows == {"recent": True, "live": True}, "ended ones go, the others wait for their end"
    assert (
        _enqueue(dsn, "ended") is not None
        and _enqueue(dsn, "recent") is None
        and _enqueue(dsn, "live") is None
    )


# -- races -----------------------------------------------------------------------------------------


def _race(dsn: str, n: int, attempt: Callable[[psycopg.Connection[Any], int], Any]) -> list[Any]:
    """`n` threads, a connection each, released together; what each attempt returned."""
    barrier, results, errors = threading.Barrier(n), [None] * n, []

    def run(i: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait(timeout=60)
                results[i] = attempt(conn, i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


@pytest.mark.parametrize("ordering_key", [None, "customer-9"])
def test_exactly_one_of_many_concurrent_enqueuers_wins_a_free_key_and_an_ended_window(
    dsn, ordering_key
):
    for round_ in range(3):
        key = f"race-{round_}"

        def attempt(conn: psycopg.Connection[Any], i: int, key: str = key) -> int | None:
            return enqueue_sync(
                conn, "send", {}, dedupe_key=key, dedupe_window_s=0.5, ordering_key=ordering_key
            )

        won = [r for r in _race(dsn, 8, attempt) if r is not None]
        assert len(won) == 1, won
        with psycopg.connect(dsn, autocommit=True) as conn:  # its job ends; its window passes
            conn.execute(
                "UPDATE dispatcher_jobs SET status = 'completed', "
                "updated_at = now() - interval '1 s' WHERE id = %s",
                (won[0],),
            )
        won = [r for r in _race(dsn, 8, attempt) if r is not None]
        assert len(won) == 1, f"round {round_}: {won} won an ended window"
        assert len(_jobs_with(dsn, key)) == 2


@pytest.mark.parametrize("completed_jobs", [COMPLETED_KEEP, COMPLETED_DELETE])
def test_enqueuers_racing_the_jobs_completion_never_get_in_within_the_window(dsn, completed_jobs):
    """The previous job finishes while 8 threads keep trying: none of them gets in, whether it saw
    the job live or finished (its row deleted or not)."""
    for round_ in range(3):
        _race_the_completion(dsn, f"busy-{round_}", completed_jobs, f"round {round_}")


def _race_the_completion(dsn: str, key: str, completed_jobs: str, label: str) -> None:
    """One round of the test above: 8 threads enqueue `key` while its job runs to its end."""
    first = _enqueue(dsn, key)
    assert first is not None
    stop, tries = threading.Event(), [0] * 8

    def hammer(conn: psycopg.Connection[Any], i: int) -> list[int]:
        got = []
        while not stop.is_set():
            tries[i] += 1
            if (
                job_id := enqueue_sync(conn, "send", {}, dedupe_key=key, dedupe_window_s=HOUR_S)
            ) is not None:
                got.append(job_id)
        for _ in range(3):  # and some after the end
            if (
                job_id := enqueue_sync(conn, "send", {}, dedupe_key=key, dedupe_window_s=HOUR_S)
            ) is not None:
                got.append(job_id)
        return got

    racing: list[Any] = []
    runner = threading.Thread(target=lambda: racing.extend(_race(dsn, 8, hammer)))
    runner.start()
    wait_until(lambda: min(tries) >= 2, 60.0, "every enqueuer tried a few times")
    _run_to_end(dsn, "completed", completed_jobs)
    stop.set()
    runner.join(timeout=120)
    assert [r for r in racing if r] == [], f"{label}: got in while the window held"
    assert _jobs_with(dsn, key) == ([first] if completed_jobs == COMPLETED_KEEP else [])


def test_concurrent_bulk_enqueues_of_the_same_keys_insert_each_key_once_and_never_deadlock(dsn):
    keys = [f"bulk-{n}" for n in range(6)]

    def bulk(conn: psycopg.Connection[Any], i: int) -> int:
        mine = random.Random(i).sample(keys, len(keys)) * 2
        return enqueue_many_sync(
            conn, [JobSpec("send", {"i": i}, dedupe_key=k, dedupe_window_s=HOUR_S) for k in mine]
        )

    assert sum(_race(dsn, 6, bulk)) == len(keys)
    assert fetchall(
        dsn, "SELECT dedupe_key, count(*) FROM dispatcher_jobs GROUP BY 1 ORDER BY 1"
    ) == [(k, 1) for k in sorted(keys)]
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_dedupe_windows") == len(keys)


def test_an_enqueuer_that_waited_for_the_keys_lock_judges_by_what_committed_meanwhile(dsn):
    """The snapshot trap: B saw the key free before A committed a job that also ended within A's
    transaction. B waits for A's lock, and must then see A's ended job (a fresh snapshot), not
    its old view of the key: B is refused."""
    old = _enqueue(dsn, "trap", 0.001)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'completed', updated_at = now() - interval '1 s' "
            "WHERE id = %s",
            (old,),
        )
    with psycopg.connect(dsn) as a:
        a_id = enqueue_sync(a, "send", {}, dedupe_key="trap", dedupe_window_s=HOUR_S)
        assert a_id is not None
        a.execute(
            "UPDATE dispatcher_jobs SET status = 'completed', updated_at = now() WHERE id = %s",
            (a_id,),
        )
        b_result: list[int | None] = []
        b = threading.Thread(target=lambda: b_result.append(_enqueue(dsn, "trap")))
        b.start()
        wait_until(
            lambda: fetchval(
                dsn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ),
            30.0,
            "B waiting for the key's lock",
        )
        a.commit()
    b.join(timeout=60)
    assert b_result == [None], "B got in within the window of a job that ended as it waited"
    assert _jobs_with(dsn, "trap") == [old, a_id]


def test_the_cli_enqueues_with_a_window_and_names_its_flag_when_refused(dsn):
    from tests.integration.test_cli_errors import cli, one_line_error

    first = cli(
        "enqueue", "hello", "--dedupe-key", "nightly", "--dedupe-window-s", "3600", "--dsn", dsn
    )
    assert first.returncode == 0 and first.stdout.startswith("enqueued job "), first.stderr
    _run_to_end(dsn, "completed")
    again = cli(
        "enqueue", "hello", "--dedupe-key", "nightly", "--dedupe-window-s", "3600", "--dsn", dsn
    )
    assert again.returncode == 0 and again.stdout.startswith("duplicate: "), again.stdout
    one_line_error(
        cli("enqueue", "hello", "--dedupe-window-s", "60", "--dsn", dsn),
        2,
        "--dedupe-window-s",
        "dedupe_key",
    )
    one_line_error(
        cli("enqueue", "hello", "--dedupe-key", "k", "--dedupe-window-s", "0", "--dsn", dsn),
        2,
        "--dedupe-window-s",
    )
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 1


def test_a_deleting_completion_without_windows_reads_none_and_a_keyed_one_closes_its_window(dsn):
    """DISPATCHER_COMPLETED_JOBS=delete: the completion of jobs without a window reads nothing of
    the windows table however big it is; a keyed job's completion closes its window too."""
    from dispatcher import enqueue_payloads_sync
    from dispatcher.db.store import int_array, token_array
    from tests.helpers import plan_nodes

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dispatcher_dedupe_windows (queue_name, dedupe_key, job_id, window_s, "
            "prune_after) SELECT 'default', 'w' || n, n + 10000000, 60, now() FROM "
            "generate_series(1, 20000) AS n"
        )
        conn.execute("ANALYZE dispatcher_dedupe_windows")
        enqueue_payloads_sync(conn, "plain", [{"n": n} for n in range(300)])

    async def claim_and_explain() -> list[dict[str, Any]]:
        store = JobStore(dsn, "w", completed_jobs=COMPLETED_DELETE)
        try:
            jobs = (await store.jobs_claim("default", 300, 30.0, None)).jobs
            params = {
                "ids": int_array([j.id for j in jobs]),
                "tokens": token_array([j.token for j in jobs]),
                "results_channel": "test",
            }
            conn = await store.connection()
            async with conn.transaction(force_rollback=True):
                cur = await conn.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + store._complete_sql[False], params
                )
                plan = (await cur.fetchone())[0][0]["Plan"]  # type: ignore[index]
            return list(plan_nodes(plan))
        finally:
            await store.close()

    nodes = run_async(claim_and_explain())
    windows = [
        n
        for n in nodes
        if n.get("Relation Name") == "dispatcher_dedupe_windows"
        or "dispatcher_dedupe_windows" in str(n.get("Index Name"))
    ]
    assert all(n.get("Actual Loops", 0) == 0 or n.get("Actual Rows", 0) == 0 for n in windows), (
        windows
    )
    assert not [
        n for n in windows if n["Node Type"] == "Seq Scan" and n.get("Actual Loops", 0) > 0
    ], windows
    # The closing part finds the batch's windowed jobs in the index of running windowed jobs only
    # (empty here), not by a probe per id (the DELETE's own plan: test_completed_jobs.py).
    closing = [
        n
        for n in nodes
        if n.get("Relation Name") == "dispatcher_jobs"
        and n.get("Parent Relationship") == "InitPlan"
        # the fenced completion's DELETE is a CTE of its own
        and n["Node Type"] != "ModifyTable"
    ]
    assert [(n.get("Index Name"), n.get("Actual Rows")) for n in closing] == [
        ("dispatcher_jobs_windowed_running_idx", 0)
    ], closing

    keyed = _enqueue(dsn, "keyed", ordering_key="customer-3")

    async def complete_keyed() -> None:
        store = JobStore(dsn, "w", completed_jobs=COMPLETED_DELETE)
        try:
            jobs = [
                j
                for j in (await store.jobs_claim("default", 400, 30.0, None)).jobs
                if j.id == keyed
            ]
            assert len(jobs) == 1
            assert (await store.jobs_complete([keyed], [jobs[0].token], keyed=True)).completed == 1
        finally:
            await store.close()

    run_async(complete_keyed())
    assert fetchval(
        dsn,
        "SELECT finished_at IS NOT NULL FROM dispatcher_dedupe_windows WHERE dedupe_key = 'keyed'",
    )
    assert _enqueue(dsn, "keyed", ordering_key="customer-3") is None


def test_async_enqueue_through_a_pool_and_in_the_callers_transaction_honours_windows(dsn):
    import psycopg_pool

    from dispatcher import enqueue, enqueue_many

    async def main() -> tuple[Any, ...]:
        async with psycopg_pool.AsyncConnectionPool(
            dsn, min_size=1, max_size=2, open=False
        ) as pool:
            first = await enqueue(pool, "send", {}, dedupe_key="p", dedupe_window_s=HOUR_S)
            dup = await enqueue(pool, "send", {}, dedupe_key="p", dedupe_window_s=HOUR_S)
            bulk = await enqueue_many(
                pool, [JobSpec("send", dedupe_key=k, dedupe_window_s=HOUR_S) for k in "pqq"]
            )
        # the outbox: commits with the caller
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            outbox = await enqueue(conn, "send", {}, dedupe_key="r", dedupe_window_s=HOUR_S)
            again = await enqueue(conn, "send", {}, dedupe_key="r", dedupe_window_s=HOUR_S)
        return first, dup, bulk, outbox, again

    first, dup, bulk, outbox, again = run_async(main())
    assert first is not None and dup is None and bulk == 1 and outbox is not None and again is None
    assert sorted(
        r[0] for r in fetchall(dsn, "SELECT dedupe_key FROM dispatcher_dedupe_windows")
    ) == ["p", "q", "r"]
