"""DISPATCHER_COMPLETED_JOBS against a real PostgreSQL: a completion that deletes the row (fenced
by the claim's token like the UPDATE it replaces), the history that stays, the rows that are still
kept (failed, retried, cancelled), the plan of the deleting completion, and what status and
`jobs show` say about the rows they can no longer see."""

import json

import psycopg
import pytest

from dispatcher import Config, Job, PermanentJobError, Registry, Worker, enqueue_payloads_sync
from dispatcher.admin import Filters, cancel_jobs, job_attempts, show_job
from dispatcher.db.queries import query
from dispatcher.db.store import JobStore, int_array, token_array
from dispatcher.runtime.completer import Completer
from dispatcher.settings.sections import CompletionSettings
from tests.helpers import (
    fetchall,
    fetchval,
    plan_nodes,
    reap_and_claim_again,
    run_async,
    run_worker_until,
    status_counts,
)
from tests.integration.test_cli_errors import cli, one_line_error

ALL = tuple(range(64))


def _enqueue(dsn, job_type, n, **options):
    """`n` jobs by bulk enqueue; their ids."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = conn.execute("SELECT coalesce(max(id), 0) FROM dispatcher_jobs").fetchone()[0]
        enqueue_payloads_sync(conn, job_type, [{"n": i} for i in range(n)], **options)
        return [
            r[0]
            for r in conn.execute(
                "SELECT id FROM dispatcher_jobs WHERE id > %s ORDER BY id", (before,)
            )
        ]


@pytest.mark.parametrize(
    "statement",
    [
        "jobs_complete_owned",
        "jobs_complete_owned_delete",
        "jobs_complete_owned_fenced:jobs_complete_owned",
        "jobs_complete_owned_fenced:jobs_complete_owned_delete",
    ],
)
def test_the_completion_plan_fetches_exactly_the_batch_by_primary_key(dsn, statement):
    """The trap jobs_complete_owned's comment describes: statistics taken while every row was
    queued. The completion, deleting or not, must still enter through the primary key and touch
    only the batch: no sequential scan, no lease-index walk over every running row. The same
    inside jobs_complete_owned_fenced, the form the completer sends (wrapper:completion)."""
    wrapper, _, inner = statement.rpartition(":")
    sql = query(inner) if not wrapper else query(wrapper).replace("{completion}", query(inner))
    _enqueue(dsn, "a", 50_000)  # bulk enqueue ANALYZEs: the statistics say every row is queued

    async def claim():
        store = JobStore(dsn, "w")
        try:
            return (await store.jobs_claim("default", 500, 30, ALL)).jobs
        finally:
            await store.close()

    jobs = run_async(claim())
    assert len(jobs) == 500
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Another claim's rows, running as well: the plan must not read them.
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'running', lock_token = gen_random_uuid() "
            "WHERE id IN (SELECT id FROM dispatcher_jobs WHERE status = 'queued' LIMIT 20000)"
        )
        params = {
            "ids": int_array([j.id for j in jobs]),
            "tokens": token_array([j.token for j in jobs]),
            "results_channel": "test",
        }
        with conn.transaction(force_rollback=True):
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
            ).fetchone()[0][0]["Plan"]
    nodes = list(plan_nodes(plan))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], json.dumps(plan)[:2000]
    scanned_indexes = {n.get("Index Name") for n in nodes if "Index" in n["Node Type"]}
    assert scanned_indexes == {"dispatcher_jobs_pkey"}, json.dumps(plan)[:2000]
    # A bitmap scan of the primary key counts the entries of dead row versions too (the claim's
    # UPDATE left one per job): about 1,000 here, where a walk of the running rows reads 20,000.
    read = sum(
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in nodes if n.get("Index Name")
    )
    assert read <= 5 * 500, f"read {read} index entries to complete 500"
    [modify] = [n for n in nodes if n["Node Type"] == "ModifyTable"]
    assert modify["Operation"] == ("Delete" if "delete" in statement else "Update")


def test_a_worker_under_delete_leaves_no_completed_row_but_the_history_and_every_other_outcome(dsn):
    """Only a success deletes: a retried job is a queued row until it succeeds, a failed or
    discarded one stays, and so does a cancelled one. The history keeps every attempt."""
    registry = Registry()
    tries: dict[int, int] = {}

    @registry.handler("ok")
    async def ok(job: Job) -> None:
        return None

    @registry.handler("flaky")
    async def flaky(job: Job) -> None:
        tries[job.id] = tries.get(job.id, 0) + 1
        if tries[job.id] == 1:
            raise RuntimeError("first attempt fails")

    @registry.handler("doomed")
    async def doomed(job: Job) -> None:
        raise PermanentJobError("never")

    @registry.handler("out_of_attempts")
    async def out_of_attempts(job: Job) -> None:
        raise RuntimeError("always")

    ok_ids = _enqueue(dsn, "ok", 200)
    (flaky_id,) = _enqueue(dsn, "flaky", 1)
    (doomed_id,) = _enqueue(dsn, "doomed", 1)
    (failed_id,) = _enqueue(dsn, "out_of_attempts", 1, max_attempts=1)
    (cancelled_id,) = _enqueue(dsn, "ok", 1, delay_s=3600)
    assert cancel_jobs(dsn, Filters(ids=(cancelled_id,))).changed == [cancelled_id]
    config = Config(
        dsn=dsn,
        poll_interval_s=0.1,
        flush_interval_s=0.01,
        reaper_interval_s=0.2,
        retry_base_s=0.05,
        retry_cap_s=0.05,
        history=True,
        completed_jobs="delete",
    )
    worker = Worker(config, registry)

    def done():
        return (
            fetchval(
                dsn, "SELECT count(*) FROM dispatcher_jobs WHERE status IN ('queued', 'running')"
            )
            == 0
        )

    run_async(run_worker_until(worker, done, 60, "every job finished"))
    assert status_counts(dsn) == {"discarded": 1, "failed": 1, "cancelled": 1}
    assert dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs")) == {
        doomed_id: "discarded",
        failed_id: "failed",
        cancelled_id: "cancelled",
    }
    assert worker.completer.stats.completed == 201 and worker.completer.stats.fenced == 0
    history = fetchall(
        dsn, "SELECT job_id, attempt, outcome FROM dispatcher_job_attempts ORDER BY job_id, attempt"
    )
    assert [(a, o) for j, a, o in history if j == flaky_id] == [(1, "retried"), (2, "completed")]
    assert {j for j, _, o in history if o == "completed"} == {*ok_ids, flaky_id}
    # The admin API: no row, but the history.
    assert show_job(dsn, ok_ids[0]) is None
    assert [(a.attempt, a.outcome) for a in job_attempts(dsn, ok_ids[0])] == [(1, "completed")]


def test_under_keep_a_worker_leaves_completed_rows_as_before(dsn):
    registry = Registry()

    @registry.handler("ok")
    async def ok(job: Job) -> None:
        return None

    _enqueue(dsn, "ok", 50)
    config = Config(dsn=dsn, poll_interval_s=0.1, flush_interval_s=0.01, completed_jobs="keep")
    worker = Worker(config, registry)
    run_async(
        run_worker_until(
            worker, lambda: status_counts(dsn).get("completed") == 50, 30, "50 completed"
        )
    )
    assert status_counts(dsn) == {"completed": 50}
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE completed_at IS NULL") == 0


def test_a_deleting_completion_by_an_owner_taken_over_deletes_nothing_and_counts_fenced(dsn):
    """Lease expired, reaped, claimed again by another worker: the stale owner's completion
    deletes nothing (counted fenced), and the job runs and completes under its new claim."""
    _enqueue(dsn, "a", 3)
    settings = CompletionSettings(
        flush_interval_s=0.01, flush_max=100, history=False, completed_jobs="delete"
    )

    async def main():
        old = JobStore(dsn, "old", completed_jobs="delete")
        new = JobStore(dsn, "new", completed_jobs="delete")
        try:
            stale, fresh = await reap_and_claim_again(dsn, old, new)
            assert len(stale) == 3
            stale_completer = Completer(old, settings)
            for job in stale:
                stale_completer.completed(job, 0.01)
            await stale_completer.flush()
            assert (stale_completer.stats.completed, stale_completer.stats.fenced) == (0, 3)
            assert set(
                fetchall(dsn, "SELECT status, locked_by, attempts FROM dispatcher_jobs")
            ) == {("running", "new", 2)}
            new_completer = Completer(new, settings)
            for job in fresh:
                new_completer.completed(job, 0.01)
            await new_completer.flush()
            assert (new_completer.stats.completed, new_completer.stats.fenced) == (3, 0)
        finally:
            await old.close()
            await new.close()

    run_async(main())
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0


def test_status_and_jobs_show_say_what_a_deleting_completion_hides(dsn):
    (gone,) = _enqueue(dsn, "a", 1)
    (kept,) = _enqueue(dsn, "a", 1, delay_s=3600)

    async def complete_one():
        store = JobStore(dsn, "w", completed_jobs="delete")
        try:
            jobs = (await store.jobs_claim("default", 10, 30, ALL)).jobs
            assert [j.id for j in jobs] == [gone]
            await store.history_record(_history(jobs[0]))
            assert (await store.jobs_complete([gone], [jobs[0].token])).completed == 1
        finally:
            await store.close()

    run_async(complete_one())
    env = {"DISPATCHER_COMPLETED_JOBS": "delete"}
    status = cli("status", "--dsn", dsn, env=env)
    assert status.returncode == 0, status.stderr
    assert "deleted*" in status.stdout and "DISPATCHER_COMPLETED_JOBS=delete" in status.stdout
    kept_status = cli("status", "--dsn", dsn)
    assert "deleted*" not in kept_status.stdout, "under keep, the count is a count"
    shown = cli("jobs", "show", str(gone), "--dsn", dsn, env=env)
    one_line_error(
        shown, 1, f"no job {gone}", "DISPATCHER_COMPLETED_JOBS=delete", "may have completed"
    )
    assert "its attempts from the history (1)" in shown.stdout and "completed" in shown.stdout
    listed = cli(
        "jobs", "list", "--status", "completed", "--dsn", dsn, "--completed-jobs", "delete"
    )
    assert listed.returncode == 0 and "completed jobs are not listed" in listed.stdout, listed
    assert cli("jobs", "show", str(kept), "--dsn", dsn, env=env).returncode == 0
    one_line_error(cli("jobs", "show", "999999", "--dsn", dsn), 1, "no job 999999")


def _history(job):
    from dispatcher.db.rows import HistoryRows

    rows = HistoryRows()
    rows.add(job.id, job.attempts, "w", job.locked_at, 1.0, "completed", None)
    return rows


def test_an_invalid_setting_is_refused_naming_it_and_the_allowed_values(dsn):
    one_line_error(
        cli("status", "--dsn", dsn, env={"DISPATCHER_COMPLETED_JOBS": "drop"}),
        2,
        "DISPATCHER_COMPLETED_JOBS",
        "keep, delete",
        "'drop'",
    )


def test_the_store_refuses_an_unknown_value():
    with pytest.raises(ValueError, match="keep, delete"):
        JobStore("postgresql:///x", "w", completed_jobs="drop")
