"""The operator side of ordering keys against a real PostgreSQL and an in-process Worker: a final
failure halts its key (the key's later jobs wait, other keys run) or, for a "continue" handler,
lets the next job run; a retry, cancel or purge of the halted job lets the key go on, in order;
a waiting job is cancelled at once; the pruner never deletes a halted job; `jobs list --halted`,
`enqueue --ordering-key` and `status` show it all. (The core rules: tests of the enqueue, claim
and completion statements; races and crashes: the chaos tests.)"""

from __future__ import annotations

import threading
from typing import Any

import orjson
import psycopg

from dispatcher import Config, Registry, Worker, enqueue_sync
from dispatcher.admin import (
    Filters,
    cancel_jobs,
    list_halted_keys,
    list_jobs,
    purge_jobs,
    retry_jobs,
    show_job,
)
from dispatcher.api.status import read_status
from dispatcher.db.store import JobStore
from tests.helpers import fetchall, fetchval, run_async, run_worker_until
from tests.integration.test_admin import add, statuses
from tests.integration.test_admin_cli import jobs
from tests.integration.test_cli_errors import cli
from tests.integration.test_retention import pruner_on, tick

DEADLINE_S = 30


class Recorder:
    """A registry whose handlers record (key, job id) in the order they ran. Type 'step' succeeds;
    'flaky' fails (max_attempts=1: for good) until its id is healed; 'flaky_go_on' likewise, with a
    handler that lets its key go on after a final failure."""

    def __init__(self) -> None:
        self.runs: list[tuple[str | None, int]] = []
        self.healed: set[int] = set()
        self._lock = threading.Lock()
        self.registry = Registry()
        self.registry.handler("step")(self._run)
        self.registry.handler("flaky")(self._flaky)
        self.registry.handler("flaky_go_on", on_ordered_failure="continue")(self._flaky)

    def _run(self, job: Any) -> None:
        with self._lock:
            self.runs.append((job.ordering_key, job.id))

    def _flaky(self, job: Any) -> None:
        self._run(job)
        if job.id not in self.healed:
            raise RuntimeError(f"job {job.id} fails")

    def of(self, key: str) -> list[int]:
        return [job_id for k, job_id in self.runs if k == key]

    def run_until(self, dsn: str, predicate: Any, what: str) -> None:
        worker = Worker(Config(dsn=dsn, poll_interval_s=0.1, flush_interval_s=0.01), self.registry)
        run_async(run_worker_until(worker, predicate, DEADLINE_S, what))


def enqueue(
    dsn: str, key: str | None, *types: str, queue: str = "default", **options: Any
) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            enqueue_sync(
                conn, t, {"n": i}, queue=queue, ordering_key=key, max_attempts=1, **options
            )
            for i, t in enumerate(types)
        ]


async def queue_depth(dsn: str) -> list[Any]:
    store = JobStore(dsn, "depth-test")
    try:
        return await store.queue_depth()
    finally:
        await store.close()


def halted(dsn: str, job_id: int) -> bool:
    return bool(
        fetchval(dsn, "SELECT ordering_halted FROM dispatcher_jobs WHERE id = %s", (job_id,))
    )


def halt_key_a(dsn: str, rec: Recorder) -> tuple[list[int], list[int]]:
    """Key 'a': a flaky job, then two steps; key 'b': two steps. Runs a worker until the flaky job
    failed and b's jobs completed."""
    a = enqueue(dsn, "a", "flaky", "step", "step")
    b = enqueue(dsn, "b", "step", "step")
    rec.run_until(
        dsn,
        lambda: statuses(dsn, a[:1] + b) == ["failed", "completed", "completed"],
        "a's first job failed, b's jobs completed",
    )
    return a, b


def test_a_final_failure_halts_its_key_while_other_keys_run(dsn):
    rec = Recorder()
    a, b = halt_key_a(dsn, rec)
    assert statuses(dsn, a) == ["failed", "waiting", "waiting"] and halted(dsn, a[0])
    assert rec.of("a") == a[:1] and rec.of("b") == b
    (key,) = list_halted_keys(dsn)
    assert (key.queue, key.ordering_key, key.job_id, key.job_type, key.status, key.waiting) == (
        "default",
        "a",
        a[0],
        "flaky",
        "failed",
        2,
    )
    assert key.failed_at is not None and "job" in key.last_error and "fails" in key.last_error
    assert list_halted_keys(dsn, Filters(queues=("other",))) == []
    assert [r.id for r in list_jobs(dsn, Filters(statuses=("waiting",)))] == a[:0:-1]
    detail = show_job(dsn, a[0])
    assert detail is not None and (detail.job["ordering_key"], detail.job["ordering_halted"]) == (
        "a",
        True,
    )
    status = read_status(dsn)["queues"]["default"]
    assert (status["counts"]["waiting"], status["halted_keys"]) == (2, 1)
    depth = {(row.queue, row.status): row.jobs for row in run_async(queue_depth(dsn))}
    assert (
        depth[("default", "waiting")],
        depth[("default", "halted")],
        depth[("default", "failed")],
    ) == (2, 1, 1)


def test_a_continue_handler_lets_the_next_job_run_after_a_final_failure(dsn):
    rec = Recorder()
    a = enqueue(dsn, "a", "flaky_go_on", "step", "step")
    rec.run_until(
        dsn, lambda: statuses(dsn, a) == ["failed", "completed", "completed"], "a's jobs ended"
    )
    assert rec.of("a") == a and not halted(dsn, a[0]) and list_halted_keys(dsn) == []


def test_a_retry_of_the_halted_job_runs_it_again_then_the_rest_in_order(dsn):
    rec = Recorder()
    a, _ = halt_key_a(dsn, rec)
    rec.healed.add(a[0])
    result = retry_jobs(dsn, Filters(halted=True))  # a bulk retry of every halted job
    assert result.changed == a[:1]
    assert statuses(dsn, a) == ["queued", "waiting", "waiting"] and not halted(dsn, a[0])
    rec.run_until(dsn, lambda: statuses(dsn, a) == ["completed"] * 3, "key a ran to the end")
    assert rec.of("a") == [a[0], a[0], a[1], a[2]]
    assert list_halted_keys(dsn) == []


def test_a_retry_of_a_job_that_no_longer_holds_its_key_waits_and_runs_next(dsn):
    rec = Recorder()
    first = enqueue(dsn, "k", "flaky_go_on", "step")
    rec.run_until(dsn, lambda: statuses(dsn, first) == ["failed", "completed"], "k's jobs ended")
    # The key is free: the retried job is promoted at once.
    rec.healed.add(first[0])
    assert retry_jobs(dsn, Filters(ids=(first[0],))).changed == first[:1]
    assert statuses(dsn, first[:1]) == ["queued"]
    rec.run_until(dsn, lambda: statuses(dsn, first[:1]) == ["completed"], "the retried job ran")
    # The key has a holder: the retried job waits behind it, and is the next to run.
    rec.healed.clear()
    again = enqueue(dsn, "k", "flaky_go_on")
    rec.run_until(dsn, lambda: statuses(dsn, again) == ["failed"], "it failed")
    holder, behind = enqueue(dsn, "k", "step", "step")
    rec.healed.add(again[0])
    assert retry_jobs(dsn, Filters(ids=(again[0],))).changed == again
    assert statuses(dsn, [holder, again[0], behind]) == ["queued", "waiting", "waiting"]
    rec.runs.clear()
    rec.run_until(
        dsn, lambda: statuses(dsn, [holder, again[0], behind]) == ["completed"] * 3, "k ran"
    )
    assert rec.of("k") == [holder, again[0], behind]


def test_a_cancel_of_the_halted_job_lets_the_rest_run_in_order(dsn):
    rec = Recorder()
    a, _ = halt_key_a(dsn, rec)
    result = cancel_jobs(dsn, Filters(ids=(a[0],)))
    assert result.changed == a[:1] and result.skipped == []
    # Promoted by the cancel itself: no worker ran meanwhile.
    assert statuses(dsn, a) == ["cancelled", "queued", "waiting"] and not halted(dsn, a[0])
    rec.run_until(dsn, lambda: statuses(dsn, a[1:]) == ["completed"] * 2, "key a went on")
    assert rec.of("a") == a


def test_a_purge_of_the_halted_job_lets_the_rest_run_in_order(dsn):
    rec = Recorder()
    a, _ = halt_key_a(dsn, rec)
    assert purge_jobs(dsn, Filters(ids=(a[0],))).changed == a[:1]
    assert statuses(dsn, a) == [None, "queued", "waiting"]
    rec.run_until(dsn, lambda: statuses(dsn, a[1:]) == ["completed"] * 2, "key a went on")
    assert rec.of("a") == a


def test_a_waiting_job_and_a_queued_holder_are_cancelled_at_once(dsn):
    k = enqueue(dsn, "k", "step", "step", "step", "step")
    assert statuses(dsn, k) == ["queued", "waiting", "waiting", "waiting"]
    assert cancel_jobs(dsn, Filters(ids=(k[1],))).changed == [k[1]]
    assert statuses(dsn, k) == ["queued", "cancelled", "waiting", "waiting"]
    # The holder cancelled: the key's next job (not the cancelled one) is promoted.
    assert cancel_jobs(dsn, Filters(ids=(k[0],))).changed == [k[0]]
    assert statuses(dsn, k) == ["cancelled", "cancelled", "queued", "waiting"]
    # A failed job that does not halt its key is not cancelled.
    (free,) = add(dsn, status="failed")
    skipped = cancel_jobs(dsn, Filters(ids=(free,))).skipped
    assert [(s.id, s.reason.split(":")[0]) for s in skipped] == [
        (free, "it is failed and does not halt its ordering key")
    ]
    rec = Recorder()
    rec.run_until(dsn, lambda: statuses(dsn, k[2:]) == ["completed"] * 2, "the rest ran")
    assert rec.of("k") == k[2:]


def test_a_retry_counts_waiting_jobs_as_live_for_dedupe_keys(dsn):
    enqueue(dsn, "k", "step")
    (behind,) = enqueue(dsn, "k", "step", dedupe_key="d")
    (failed,) = add(dsn, status="failed", dedupe_key="d")
    result = retry_jobs(dsn, Filters(ids=(failed,)))
    assert [(s.id, s.reason) for s in result.skipped] == [
        (failed, "a live job holds its dedupe key")
    ]
    assert statuses(dsn, [behind, failed]) == ["waiting", "failed"]


def test_the_pruner_never_deletes_a_halted_job(dsn):
    rec = Recorder()
    a, _ = halt_key_a(dsn, rec)
    (plain,) = add(dsn, status="failed")
    with psycopg.connect(dsn, autocommit=True) as conn:  # both far past the failed retention
        conn.execute(
            "UPDATE dispatcher_jobs SET updated_at = now() - interval '30 days' WHERE id = ANY(%s)",
            ([a[0], plain],),
        )
    pruner, store = pruner_on(dsn)
    tick(pruner, store)
    assert pruner.last_round.deleted["failed"] == 1
    assert statuses(dsn, [plain, *a]) == [None, "failed", "waiting", "waiting"] and halted(
        dsn, a[0]
    )


def test_the_cli_enqueues_with_an_ordering_key_and_lists_halted_keys(dsn):
    one = cli("enqueue", "step", "--ordering-key", "acct-1", "--dsn", dsn)
    assert one.returncode == 0, one.stderr
    more = cli("enqueue", "step", "--ordering-key", "acct-1", "--count", "3", "--dsn", dsn)
    assert more.returncode == 0 and more.stdout.strip() == "enqueued 3 jobs", more
    ids = [
        row[0]
        for row in fetchall(
            dsn, "SELECT id FROM dispatcher_jobs WHERE ordering_key = 'acct-1' ORDER BY id"
        )
    ]
    assert statuses(dsn, ids) == ["queued", "waiting", "waiting", "waiting"]
    # the key picks the bucket
    assert fetchval(dsn, "SELECT count(DISTINCT bucket) FROM dispatcher_jobs") == 1
    waiting = jobs(dsn, "list", "--status", "waiting")
    assert waiting.returncode == 0 and len(waiting.stdout.splitlines()) == 4, waiting

    # The holder fails for good and halts the key (as jobs_fail_owned writes it).
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'failed', ordering_halted = true, failed_at = "
            "now(), last_error = 'Traceback ...\nValueError: bad account' WHERE id = %s",
            (ids[0],),
        )
    table = jobs(dsn, "list", "--halted")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["queue", "ordering", "key", "job"]
    assert lines[1].split()[:5] == ["default", "acct-1", str(ids[0]), "step", "failed"]
    assert lines[1].split()[-4:] == ["3", "ValueError:", "bad", "account"]
    (listed,) = orjson.loads(jobs(dsn, "list", "--halted", "--json").stdout)
    assert (listed["job_id"], listed["ordering_key"], listed["waiting"]) == (ids[0], "acct-1", 3)
    shown = jobs(dsn, "show", str(ids[0]))
    assert "ordering key 'acct-1': HALTED by this job" in shown.stdout, shown
    status = cli("status", "--dsn", dsn)
    assert status.returncode == 0 and "halted keys" in status.stdout.splitlines()[0], status

    asked = jobs(dsn, "cancel", "--halted")
    assert asked.returncode == 1 and asked.stdout.startswith("1 jobs match"), asked
    done = jobs(dsn, "cancel", "--halted", "--yes")
    assert done.returncode == 0 and done.stdout.startswith("cancelled 1 of 1 jobs"), done
    assert statuses(dsn, ids) == ["cancelled", "queued", "waiting", "waiting"]
    assert jobs(dsn, "list", "--halted").stdout.strip() == "(no halted ordering keys)"
