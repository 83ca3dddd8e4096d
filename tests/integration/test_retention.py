"""Retention: the pruner against a real PostgreSQL. Each kind (completed jobs; failed, discarded
and cancelled ones; history rows) is deleted past its own retention and not before, live jobs
never; in batches; one pod at a time (a round skipped while another holds the lock, shown with the
lock itself, not with timing); 0 keeps forever. Then a real worker process prunes and exports it."""

import asyncio
import urllib.request

import psycopg
import pytest
from prometheus_client import REGISTRY

from dispatcher.db.queries import query
from dispatcher.db.store import JobStore
from dispatcher.runtime.janitor import Pruner
from dispatcher.settings.sections import RetentionSettings
from tests.helpers import (
    fetchall,
    fetchval,
    free_port,
    run_async,
    start_worker,
    status_counts,
    stop_workers,
    wait_until,
)
from tests.integration.test_admin import add

HOUR, DAY = 3600.0, 86400.0
RETENTIONS = {"completed": HOUR, "failed": 7 * DAY, "history": 7 * DAY}


def add_history(dsn: str, n: int, age_s: float) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO dispatcher_job_attempts
                        SELECT i, 1, 'w', now() - %(age)s * interval '1 s',
                               now() - %(age)s * interval '1 s', 1.0, 'completed', NULL
                          FROM generate_series(1, %(n)s) AS i""",
            {"age": age_s, "n": n},
        )


def counts(dsn: str) -> dict[str, int]:
    return {
        **status_counts(dsn),
        "history": fetchval(dsn, "SELECT count(*) FROM dispatcher_job_attempts"),
    }


def sample(name: str, kind: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"kind": kind})


def pruned(kind: str) -> float:
    return sample("dispatcher_jobs_pruned_total", kind) or 0.0


def metrics_page(port: int) -> str:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return ""  # not serving yet


def pruner_on(
    dsn: str, retentions=RETENTIONS, batch: int = 1000, pod: str = "pruner-test"
) -> tuple[Pruner, JobStore]:
    store = JobStore(dsn, pod)
    return Pruner(
        store, RetentionSettings(interval_s=60, retentions_s=retentions, batch=batch)
    ), store


def tick(pruner: Pruner, store: JobStore) -> float | None:
    async def once():
        try:
            # never waits for a lock: would time out here
            return await asyncio.wait_for(pruner.tick(), 30)
        finally:
            await store.close()

    return run_async(once())


def test_each_kind_is_pruned_past_its_retention_and_not_before_and_live_jobs_never(dsn):
    add(dsn, 3, status="completed", age_s=2 * HOUR)
    young_completed = add(dsn, 2, status="completed", age_s=HOUR / 2)
    for status in ("failed", "discarded", "cancelled"):
        add(dsn, 2, status=status, age_s=8 * DAY)
        add(dsn, 1, status=status, age_s=6 * DAY)
    live = add(dsn, 2, age_s=30 * DAY) + add(dsn, 1, status="running", age_s=30 * DAY)
    add_history(dsn, 4, 8 * DAY)
    add_history(dsn, 1, DAY)
    before = {kind: pruned(kind) for kind in RETENTIONS}
    pruner, store = pruner_on(dsn)
    assert tick(pruner, store) is None  # caught up: the next round an interval later
    assert pruner.last_round.deleted == {"completed": 3, "failed": 6, "history": 4}
    assert counts(dsn) == {
        "completed": 2,
        "failed": 1,
        "discarded": 1,
        "cancelled": 1,
        "queued": 2,
        "running": 1,
        "history": 1,
    }
    assert {kind: pruned(kind) - before[kind] for kind in RETENTIONS} == {
        "completed": 3,
        "failed": 6,
        "history": 4,
    }
    assert all(sample("dispatcher_janitor_lag_seconds", kind) == 0.0 for kind in RETENTIONS)
    still = fetchall(
        dsn,
        "SELECT id FROM dispatcher_jobs WHERE status IN ('completed', 'queued', 'running') "
        "ORDER BY id",
    )
    assert [r[0] for r in still] == sorted(young_completed + live)


def test_a_backlog_goes_in_batches_and_the_lag_shows_until_it_is_caught_up(dsn):
    add(dsn, 2500, status="completed", age_s=3 * HOUR)
    pruner, store = pruner_on(dsn, {"completed": HOUR, "failed": 0, "history": 0})
    pruner.ROUND_STATEMENTS = 2  # two DELETEs of at most 1,000 rows in a round
    again_s = tick(pruner, store)
    assert pruner.last_round.deleted["completed"] == 2000 and pruner.last_round.more
    assert again_s is not None and again_s < 1.0, "more is waiting: the next round comes soon"
    lag = sample("dispatcher_janitor_lag_seconds", "completed")
    # the oldest row left is 3 h old, kept 1 h: 2 h late
    assert 2 * HOUR - 60 < lag < 2 * HOUR + 60, lag
    assert tick(pruner, store) is None
    assert pruner.last_round.deleted["completed"] == 500 and not pruner.last_round.more
    assert sample("dispatcher_janitor_lag_seconds", "completed") == 0.0
    assert counts(dsn) == {"history": 0}


def test_a_round_is_skipped_while_another_pod_holds_the_pruners_lock(dsn):
    """Two pruners never work at once: the round's transaction takes a try-lock first. Here the
    lock is held the way another pod's round holds it, and this pod's round skips at once."""
    add(dsn, 3, status="completed", age_s=2 * HOUR)
    pruner, store = pruner_on(dsn)
    with psycopg.connect(dsn) as other_pod:
        # its round is running
        assert other_pod.execute(query("prune_try_lock")).fetchone() == (True,)
        assert tick(pruner, store) is None
        assert (pruner.skipped, pruner.rounds) == (1, 0) and status_counts(dsn) == {"completed": 3}
        assert sample("dispatcher_janitor_lag_seconds", "completed") is None, (
            "the pruning pod exports the lag"
        )
        other_pod.rollback()  # its round is over
    tick(pruner, store)
    assert (pruner.skipped, pruner.rounds) == (1, 1) and status_counts(dsn) == {}
    # Transaction-scoped: nothing is held between rounds, so another pod's next round may prune.
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        assert conn.execute(query("prune_try_lock")).fetchone() == (True,)


def test_only_the_pod_holding_the_janitor_lease_prunes_until_it_gives_the_lease_up(dsn):
    """One pruning pod, not one per round: the janitor lease stays with its holder while it renews
    it, so the lag is exported by one pod; at shutdown it is given up and the next pod prunes."""
    add(dsn, 3, status="completed", age_s=2 * HOUR)
    first, first_store = pruner_on(dsn, pod="pod-a")
    second, second_store = pruner_on(dsn, pod="pod-b")
    tick(first, first_store)
    assert first.holding and first.rounds == 1 and status_counts(dsn) == {}
    add(dsn, 2, status="completed", age_s=2 * HOUR)
    tick(second, second_store)
    assert (second.holding, second.rounds, second.skipped) == (False, 0, 1)
    assert status_counts(dsn) == {"completed": 2}, "a pod without the lease pruned"
    tick(first, first_store)  # renewed: still the holder
    assert first.holding and first.rounds == 2 and status_counts(dsn) == {}

    async def release():
        try:
            await first.release()
        finally:
            await first_store.close()

    run_async(release())
    add(dsn, 1, status="completed", age_s=2 * HOUR)
    tick(second, second_store)
    assert second.holding and second.rounds == 1 and status_counts(dsn) == {}


def test_a_retention_of_0_keeps_that_kind_forever(dsn):
    add(dsn, 2, status="completed", age_s=400 * DAY)
    add(dsn, 2, status="failed", age_s=400 * DAY)
    add_history(dsn, 2, 400 * DAY)
    pruner, store = pruner_on(dsn, {"completed": 0, "failed": 7 * DAY, "history": 0})
    tick(pruner, store)
    assert pruner.last_round.deleted == {"failed": 2}
    assert counts(dsn) == {"completed": 2, "history": 2}
    keep_all, store = pruner_on(dsn, {"completed": 0, "failed": 0, "history": 0})
    tick(keep_all, store)
    assert keep_all.retired and keep_all.rounds == 0  # nothing to prune, ever: the service ends
    assert counts(dsn) == {"completed": 2, "history": 2}


@pytest.mark.slow
def test_a_worker_prunes_completed_jobs_and_exports_what_it_pruned(dsn, tmp_path):
    port = free_port()
    add(dsn, 20, status="failed", age_s=8 * DAY)  # past the default 7 days
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dispatcher_jobs (job_type, bucket) SELECT 'record', i % 64 "
            "FROM generate_series(1, 30) AS i"
        )
    worker = start_worker(
        dsn,
        tmp_path,
        log_path=tmp_path / "w.out",
        metrics_port=port,
        poll_interval_s=0.2,
        completed_retention_s=1,
        prune_interval_s=0.5,
        history=True,
    )
    try:
        wait_until(
            lambda: fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0,
            60,
            "the 30 jobs ran and were pruned a second later, and the 20 old failures too",
        )

        pruned_30 = 'dispatcher_jobs_pruned_total{kind="completed"} 30.0'
        text = wait_until(
            lambda: (t := metrics_page(port)) and pruned_30 in t and t,
            10,
            "the metrics show 30 completed jobs pruned",
        )
        assert 'dispatcher_jobs_pruned_total{kind="failed"} 20.0' in text
        assert 'dispatcher_janitor_lag_seconds{kind="history"}' in text
    finally:
        assert stop_workers([worker]) == [0]
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_job_attempts") == 30  # kept a week
