"""The builders of dispatcher/db/rows.py: a claim's and a completion's rows as typed results,
including the one row of NULLs a statement returns when it claimed nothing."""

from __future__ import annotations

from dispatcher.db import rows

TOKEN = "00000000-0000-0000-0000-000000000001"


def claim_row(job_id: int, selected: int = 2) -> tuple[object, ...]:
    # jobs_claim's columns (sql/claim.sql), in order
    return (job_id, "send", {"n": job_id}, 1, None, 1.5, 7, -1, "k", selected, None, 0.25, None)


def test_a_claims_rows_become_jobs_with_named_fields_and_their_waits():
    claimed = rows.claimed([claim_row(1), claim_row(2)], TOKEN, "mail")
    assert (claimed.selected, claimed.stale, claimed.waited_s) == (2, False, [0.25, 0.25])
    job = claimed.jobs[0]
    assert (job.id, job.job_type, job.payload, job.attempts, job.max_attempts) == (
        1,
        "send",
        {"n": 1},
        1,
        None,
    )
    assert (job.bucket, job.priority, job.ordering_key, job.token, job.queue) == (
        7,
        -1,
        "k",
        TOKEN,
        "mail",
    )
    assert job.locked_at is not None and job.locked_at.timestamp() == 1.5


def test_a_claim_of_nothing_and_a_stale_claim():
    nulls = (None,) * 9
    nothing = rows.claimed([(*nulls, 3, None, None, None)], TOKEN, "mail")
    assert (nothing.jobs, nothing.selected, nothing.stale) == ([], 3, False)
    stale = rows.claimed([(*nulls, None, None, None, None)], TOKEN, "mail")
    assert (stale.jobs, stale.stale) == ([], True)


def test_completions_answer_the_count_the_refused_ids_and_the_chained_jobs():
    assert rows.completion_fenced(([4],), 3) == rows.Completion(2, [4])
    assert rows.completion_fenced(None, 3) == rows.Completion(3, [])
    with_parents = rows.completion_fenced(([], [7, 8], 0), 3)
    assert (with_parents.completed, with_parents.parents) == (3, [7, 8])
    keyed = (
        5,
        "send",
        {},
        1,
        3,
        2.0,
        1,
        0,
        "k",
        "mail",
        2,
        1,
        [9],
        0.5,
        {"traceparent": "x"},
        [6],
        1,
    )
    done = rows.completion_keyed([keyed], TOKEN)
    assert (done.completed, done.fenced, done.waited_s, done.parents) == (2, [9], [0.5], [6])
    (job,) = done.claimed
    assert (job.id, job.queue, job.token, job.trace_context) == (
        5,
        "mail",
        TOKEN,
        {"traceparent": "x"},
    )
    none_claimed = rows.completion_keyed([(*(None,) * 10, 2, 0, [], None, None, [], 0)], TOKEN)
    assert none_claimed == rows.Completion(2, [])


def test_a_claim_windows_veto_and_the_rows_of_a_window_that_claimed():
    nulls = (None,) * 9
    vetoed = rows.claimed([(*nulls, 0, None, None, None, True)], TOKEN, "mail")
    assert (vetoed.jobs, vetoed.selected, vetoed.outranked) == ([], 0, True)
    empty = rows.claimed([(*nulls, 0, None, None, None, False)], TOKEN, "mail")
    assert (empty.jobs, empty.outranked) == ([], False)
    took = rows.claimed([(*claim_row(1), False), (*claim_row(2), False)], TOKEN, "mail")
    assert [j.id for j in took.jobs] == [1, 2]
    assert (took.selected, took.outranked, took.waited_s) == (2, False, [0.25, 0.25])
