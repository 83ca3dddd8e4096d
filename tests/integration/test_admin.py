"""The failed-job admin (dispatcher/admin.py) against a real PostgreSQL: each command, its
filters, bulk changes in batches, and the status re-check of every write. Retried jobs are then
run by a real worker. (The CLI: test_admin_cli.py; cancels reaching running jobs:
test_cancel.py.)"""

import re
import threading
from dataclasses import replace
from datetime import timedelta

import psycopg
import pytest

from coordinator.pg.connect import ConnectionLimits
from dispatcher import Config, Registry, Worker
from dispatcher.admin import (
    AdminInputError,
    Filters,
    cancel_jobs,
    count_jobs,
    list_jobs,
    match_jobs,
    purge_jobs,
    retry_jobs,
    show_job,
)
from dispatcher.errors import StoreError
from tests.helpers import fetchall, fetchval, run_async, run_worker_until, wait_until


def add(
    dsn: str,
    n: int = 1,
    *,
    status: str = "queued",
    queue: str = "default",
    job_type: str = "t",
    age_s: float = 0.0,
    attempts: int = 0,
    max_attempts: int = 20,
    dedupe_key: str | None = None,
    last_error: str | None = None,
    delay_s: float = 0.0,
) -> list[int]:
    """`n` jobs already in `status` for `age_s` seconds (test set-up, in one statement); their ids
    in enqueue order (a Citus cluster returns the rows shard by shard)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            """INSERT INTO dispatcher_jobs (queue_name, job_type, status, bucket, attempts,
                                            max_attempts, dedupe_key, last_error, run_at,
                                            updated_at, created_at, failed_at, completed_at,
                                            lock_token, locked_by, locked_at, lease_expires_at,
                                            payload)
               SELECT %(queue)s, %(type)s, %(status)s, i %% 64, %(attempts)s, %(max)s, %(key)s,
                      %(error)s,
                      now() + %(delay)s * interval '1 s', now() - %(age)s * interval '1 s',
                      now() - %(age)s * interval '1 s',
                      CASE WHEN %(status)s IN ('failed', 'discarded')
                           THEN now() - %(age)s * interval '1 s' END,
                      CASE WHEN %(status)s = 'completed' THEN now() - %(age)s * interval '1 s' END,
                      CASE WHEN %(status)s = 'running' THEN gen_random_uuid() END,
                      CASE WHEN %(status)s = 'running' THEN 'elsewhere' END,
                      CASE WHEN %(status)s = 'running' THEN now() END,
                      CASE WHEN %(status)s = 'running' THEN now() + interval '1 hour' END,
                      jsonb_build_object('i', i)
                 FROM generate_series(1, %(n)s) AS i
            RETURNING id""",
            {
                "queue": queue,
                "type": job_type,
                "status": status,
                "attempts": attempts,
                "max": max_attempts,
                "key": dedupe_key,
                "error": last_error,
                "delay": delay_s,
                "age": age_s,
                "n": n,
            },
        ).fetchall()
    return sorted(r[0] for r in rows)


def statuses(dsn: str, ids: list[int]) -> list[str | None]:
    found = dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs WHERE id = ANY(%s)", (ids,)))
    return [found.get(i) for i in ids]


# -- list, count, show -----------------------------------------------------------------------------


def test_list_filters_by_status_queue_type_age_and_id_newest_first(dsn):
    old_failed = add(
        dsn, 2, status="failed", queue="mail", job_type="send", age_s=7200, last_error="boom"
    )
    new_failed = add(dsn, 2, status="failed", queue="mail", job_type="send", age_s=60)
    discarded = add(dsn, 1, status="discarded", queue="billing", job_type="charge", age_s=60)
    queued = add(dsn, 3)

    def ids(**filters):
        return [r.id for r in list_jobs(dsn, Filters(**filters))]

    assert ids() == sorted(old_failed + new_failed + discarded + queued, reverse=True)
    assert ids(statuses=("failed",)) == sorted(old_failed + new_failed, reverse=True)
    assert ids(statuses=("failed", "discarded")) == sorted(
        old_failed + new_failed + discarded, reverse=True
    )
    assert ids(queues=("billing",)) == discarded
    assert ids(job_types=("send",), older_than_s=3600) == sorted(old_failed, reverse=True)
    assert ids(statuses=("failed",), newer_than_s=3600) == sorted(new_failed, reverse=True)
    assert ids(ids=(queued[0], discarded[0], 10**9)) == sorted(
        [queued[0], discarded[0]], reverse=True
    )
    assert ids(queues=("nowhere",)) == []
    assert [r.id for r in list_jobs(dsn, Filters(), limit=2)] == sorted(queued, reverse=True)[:2]
    row = list_jobs(dsn, Filters(ids=(old_failed[0],)))[0]
    assert (row.status, row.queue, row.job_type, row.last_error) == (
        "failed",
        "mail",
        "send",
        "boom",
    )
    assert 7100 < row.age_s < 7300
    assert count_jobs(dsn, Filters(queues=("mail",))) == 4
    # what a bulk retry would touch: failed and discarded
    assert count_jobs(dsn, Filters(), "retry") == 5
    assert count_jobs(dsn, Filters(), "cancel") == 3


def test_show_gives_the_row_its_last_error_and_its_attempt_history(dsn):
    (job_id,) = add(
        dsn, status="failed", attempts=2, max_attempts=2, last_error="Traceback ...\nValueError: no"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        for attempt, outcome in ((1, "retried"), (2, "failed")):
            conn.execute(
                "INSERT INTO dispatcher_job_attempts "
                "VALUES (%s, %s, 'w1', now(), now(), 12.5, %s, 'no')",
                (job_id, attempt, outcome),
            )
    detail = show_job(dsn, job_id)
    assert detail is not None
    assert detail.job["status"] == "failed" and detail.job["payload"] == {"i": 1}
    assert detail.last_error.endswith("ValueError: no")
    assert [(a.attempt, a.outcome, a.worker) for a in detail.attempts] == [
        (1, "retried", "w1"),
        (2, "failed", "w1"),
    ]
    assert show_job(dsn, 10**9) is None


# -- retry -----------------------------------------------------------------------------------------


def test_retry_by_id_requeues_failed_and_discarded_jobs_and_reports_the_rest(dsn):
    used_up = add(dsn, status="failed", attempts=3, max_attempts=3, last_error="boom")[0]
    discarded = add(dsn, status="discarded", attempts=1, max_attempts=5)[0]
    running, completed = add(dsn, status="running")[0], add(dsn, status="completed")[0]
    result = retry_jobs(dsn, Filters(ids=(used_up, discarded, running, completed, 10**9)))
    assert (result.matched, result.changed_count, sorted(result.changed)) == (
        5,
        2,
        sorted([used_up, discarded]),
    )
    reasons = {s.id: (s.status, s.reason) for s in result.skipped}
    assert reasons == {
        running: ("running", "it is running: retry applies to failed, discarded jobs"),
        completed: ("completed", "it is completed: retry applies to failed, discarded jobs"),
        10**9: (None, "no such job"),
    }
    rows = fetchall(
        dsn,
        "SELECT id, status, attempts, max_attempts, run_at <= now(), failed_at, last_error "
        "FROM dispatcher_jobs WHERE id = ANY(%s) ORDER BY id",
        ([used_up, discarded],),
    )
    # As River and Oban: the attempt count stays; max_attempts allows one more only where it was
    # used up.
    assert rows == [
        (used_up, "queued", 3, 4, True, None, "boom"),
        (discarded, "queued", 1, 5, True, None, None),
    ]
    assert statuses(dsn, [running, completed]) == ["running", "completed"]

    # A real worker runs them: each once more, as attempt 4 and 2.
    registry = Registry()
    registry.handler("t")(lambda job: None)
    worker = Worker(Config(dsn=dsn, poll_interval_s=0.1, flush_interval_s=0.01), registry)
    run_async(
        run_worker_until(
            worker,
            lambda: statuses(dsn, [used_up, discarded]) == ["completed"] * 2,
            30,
            "the retried jobs completed",
        )
    )
    assert fetchall(
        dsn,
        "SELECT attempts FROM dispatcher_jobs WHERE id = ANY(%s) ORDER BY id",
        ([used_up, discarded],),
    ) == [(4,), (2,)]


def test_a_bulk_retry_runs_in_batches_and_only_over_what_matched_when_it_began(dsn):
    failed = add(dsn, 2500, status="failed", queue="mail")
    other_queue = add(dsn, 5, status="failed", queue="billing")
    queued = add(dsn, 5, queue="mail")
    result = retry_jobs(dsn, Filters(queues=("mail",)), batch=1000)
    assert (result.matched, result.changed_count, result.skipped) == (2500, 2500, [])
    assert sorted(result.changed) == failed
    assert set(statuses(dsn, failed)) == {"queued"} and set(statuses(dsn, other_queue)) == {
        "failed"
    }
    assert set(statuses(dsn, queued)) == {"queued"}
    # up_to_id: a job that fails later (a higher id) is not swept into a change that began before
    # it.
    later = add(dsn, status="failed", queue="mail")
    assert retry_jobs(dsn, Filters(queues=("mail",)), up_to_id=later[0] - 1).changed_count == 0
    assert statuses(dsn, later) == ["failed"]


def test_a_confirmed_change_touches_exactly_what_was_counted_as_of_its_instant(dsn):
    """match_jobs, then the change with its as_of and newest id (the dashboard's confirm page): a
    job enqueued, changed or grown old enough after the count is left alone."""
    old = add(dsn, 3, status="failed", queue="mail", age_s=3600)
    running = add(dsn, status="running", queue="mail", age_s=4000)
    filters = Filters(queues=("mail",), older_than_s=1040)
    match = match_jobs(dsn, filters, "retry")
    assert (match.count, match.newest_id) == (3, old[-1]) and match.as_of.tzinfo is not None
    # After the count: the running job fails, and a job 1,070 s old now shows what time does to
    # the age filter: a minute before, when a count as of then was taken, it was 30 s too young.
    young = add(dsn, status="failed", queue="mail", age_s=1070)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'failed', updated_at = now() WHERE id = %s",
            (running[0],),
        )
    assert count_jobs(dsn, replace(filters, older_than_s=None), "retry") == 5
    assert count_jobs(dsn, filters, "retry") == 4, "now, the young job matches"
    a_minute_before = match.as_of - timedelta(seconds=60)
    assert count_jobs(dsn, replace(filters, as_of=a_minute_before), "retry") == 3, (
        "as of then, it did not"
    )
    result = retry_jobs(dsn, replace(filters, as_of=match.as_of), up_to_id=match.newest_id)
    assert (result.matched, result.changed_count, result.finished) == (3, 3, True)
    assert statuses(dsn, [*old, *running, *young]) == ["queued"] * 3 + ["failed", "failed"]
    with pytest.raises(AdminInputError, match="time zone"):
        Filters(as_of=match.as_of.replace(tzinfo=None))


def test_keep_going_stops_a_bulk_change_between_batches_and_the_rest_still_match(dsn):
    failed = add(dsn, 25, status="failed", queue="mail")
    answers = iter([True, True, False])
    result = retry_jobs(dsn, Filters(queues=("mail",)), batch=10, keep_going=lambda: next(answers))
    assert (result.matched, result.changed_count, result.finished) == (25, 20, False)
    assert statuses(dsn, failed) == ["queued"] * 20 + ["failed"] * 5
    result = retry_jobs(dsn, Filters(queues=("mail",)), batch=10, keep_going=lambda: True)
    assert (result.changed_count, result.finished) == (5, True)


def test_retry_never_makes_two_live_jobs_share_a_dedupe_key(dsn):
    held = add(dsn, status="failed", dedupe_key="k1")[0]
    add(dsn, status="queued", dedupe_key="k1")  # a live job holds k1 now
    twins = add(dsn, status="failed", dedupe_key="k2") + add(
        dsn, status="discarded", dedupe_key="k2"
    )
    result = retry_jobs(dsn, Filters(ids=(held, *twins)))
    assert result.changed == [twins[0]], "of two jobs with one key, the lowest id goes back"
    assert {s.id: s.reason for s in result.skipped} == {
        held: "a live job holds its dedupe key",
        twins[1]: "a live job holds its dedupe key",
    }
    assert statuses(dsn, [held, *twins]) == ["failed", "queued", "discarded"]


def test_a_job_that_changes_while_a_retry_waits_for_its_row_is_skipped_not_overwritten(dsn):
    """The re-check is in the write itself: here the retry waits on the row lock of a transaction
    that claims the job, then finds it running and leaves it alone."""
    (job_id,) = add(dsn, status="failed")
    with psycopg.connect(dsn) as claimer:
        claimer.execute("UPDATE dispatcher_jobs SET status = 'running' WHERE id = %s", (job_id,))
        results = []
        retry = threading.Thread(
            target=lambda: results.append(retry_jobs(dsn, Filters(ids=(job_id,))))
        )
        retry.start()
        wait_until(
            lambda: (
                fetchval(
                    dsn,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'dispatcher-admin' AND wait_event_type = 'Lock'",
                )
                == 1
            ),
            10,
            "the retry waits for the claimer's row lock",
        )
        claimer.commit()
        retry.join(10)
    (result,) = results
    assert result.changed == [] and [(s.status, s.reason) for s in result.skipped] == [
        ("failed", "its status changed meanwhile")
    ]
    assert statuses(dsn, [job_id]) == ["running"]


# -- cancel and purge ------------------------------------------------------------------------------


def test_cancel_ends_queued_and_scheduled_jobs_at_once_and_asks_running_ones(dsn):
    due, scheduled = add(dsn)[0], add(dsn, delay_s=3600)[0]
    running, completed = add(dsn, status="running")[0], add(dsn, status="completed")[0]
    result = cancel_jobs(dsn, Filters(ids=(due, scheduled, running, completed)))
    assert sorted(result.changed) == sorted([due, scheduled]) and result.requested == [running]
    assert [(s.id, s.reason) for s in result.skipped] == [
        (
            completed,
            "it is completed: cancel applies to queued, running, waiting, blocked jobs and to jobs "
            "that halt their ordering key",
        )
    ]
    assert statuses(dsn, [due, scheduled, running, completed]) == [
        "cancelled",
        "cancelled",
        "running",
        "completed",
    ]
    requested = fetchall(
        dsn, "SELECT id FROM dispatcher_jobs WHERE cancel_requested_at IS NOT NULL ORDER BY id"
    )
    assert requested == [(i,) for i in sorted([due, scheduled, running])]
    # Asking again is harmless: the request keeps its first time.
    first = fetchval(
        dsn, "SELECT cancel_requested_at FROM dispatcher_jobs WHERE id = %s", (running,)
    )
    assert cancel_jobs(dsn, Filters(ids=(running,))).requested == [running]
    assert (
        fetchval(dsn, "SELECT cancel_requested_at FROM dispatcher_jobs WHERE id = %s", (running,))
        == first
    )


def test_a_bulk_cancel_by_type_leaves_other_types_and_finished_jobs_alone(dsn):
    doomed = add(dsn, 1200, job_type="report")
    kept = add(dsn, 3, job_type="mail") + add(dsn, 2, status="failed", job_type="report")
    result = cancel_jobs(dsn, Filters(job_types=("report",)), batch=500)
    assert (result.matched, result.changed_count, result.requested_count) == (1200, 1200, 0)
    assert set(statuses(dsn, doomed)) == {"cancelled"}
    assert statuses(dsn, kept) == ["queued"] * 3 + ["failed"] * 2


def test_purge_deletes_finished_jobs_only_and_never_a_live_one(dsn):
    finished = [
        add(dsn, 2, status=s, age_s=7200) for s in ("completed", "failed", "discarded", "cancelled")
    ]
    young = add(dsn, status="completed", age_s=10)
    live = (
        add(dsn, 3, age_s=7200)
        + add(dsn, 2, status="running", age_s=7200)
        + add(dsn, delay_s=3600, age_s=7200)
    )
    assert count_jobs(dsn, Filters(older_than_s=3600), "purge") == 8
    result = purge_jobs(dsn, Filters(older_than_s=3600), batch=3)
    assert result.changed_count == 8 and sorted(result.changed) == sorted(
        i for ids in finished for i in ids
    )
    assert statuses(dsn, young + live) == ["completed"] + ["queued"] * 3 + ["running"] * 2 + [
        "queued"
    ]
    # Named by id, a live job is reported, not deleted.
    result = purge_jobs(dsn, Filters(ids=(live[0], young[0])))
    assert result.changed == [young[0]] and [s.reason for s in result.skipped] == [
        "it is queued: purge applies to completed, failed, discarded, cancelled jobs"
    ]
    assert statuses(dsn, live) == ["queued"] * 3 + ["running"] * 2 + ["queued"]


def test_ids_and_filters_together_touch_only_ids_that_match(dsn):
    mail, billing = (
        add(dsn, status="failed", queue="mail")[0],
        add(dsn, status="failed", queue="billing")[0],
    )
    result = retry_jobs(dsn, Filters(queues=("mail",), ids=(mail, billing)))
    assert result.changed == [mail]
    assert [(s.id, s.reason) for s in result.skipped] == [
        (billing, "it does not match the filters")
    ]


# -- connections and bounds ------------------------------------------------------------------------


def test_the_api_takes_an_idle_connection_of_yours_but_not_one_inside_a_transaction(dsn):
    (job_id,) = add(dsn, status="failed")
    with psycopg.connect(dsn) as conn:  # not autocommit, idle
        assert [r.id for r in list_jobs(conn, Filters(statuses=("failed",)))] == [job_id]
        # committed batch by batch
        assert retry_jobs(conn, Filters(ids=(job_id,))).changed == [job_id]
        assert statuses(dsn, [job_id]) == ["queued"]
        conn.execute("SELECT 1")  # now inside a transaction of the caller's
        with pytest.raises(AdminInputError, match="not inside a transaction"):
            cancel_jobs(conn, Filters(ids=(job_id,)))


def test_every_statement_is_bounded_by_the_statement_timeout(dsn):
    add(dsn, status="failed")
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE dispatcher_jobs IN ACCESS EXCLUSIVE MODE")  # every read waits
        with pytest.raises(
            StoreError,
            match=re.escape("gave up after 0.01 s waiting for a lock on dispatcher_jobs"),
        ):
            list_jobs(dsn, Filters(), limits=ConnectionLimits(statement_timeout_s=0.01))
    assert len(list_jobs(dsn, Filters())) == 1  # nothing left over: the next call works
