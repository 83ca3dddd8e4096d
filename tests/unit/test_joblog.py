"""Job outcome lines from written failure rows: the level, the wording by reason, the fields."""

import logging
from datetime import datetime, timedelta, timezone

import pytest

from dispatcher.db.rows import ExpiredLease, FailedWrite, Failure
from dispatcher.model import FailureKind, Job, Outcome
from dispatcher.runtime import joblog

CEST = timezone(timedelta(hours=2))  # the session's time zone need not be UTC
RUN_AT = datetime(2025, 1, 31, 11, 14, 7, 201_000, tzinfo=CEST)
LOCKED_AT = datetime(2025, 1, 31, 11, 13, 0, tzinfo=CEST)


def job(job_id: int, attempts: int = 2, max_attempts: int = 5) -> Job:
    return Job(
        id=job_id,
        job_type="send_email",
        payload={},
        attempts=attempts,
        max_attempts=max_attempts,
        locked_at=LOCKED_AT,
        bucket=17,
        priority=0,
        ordering_key=None,
        token="00000000-0000-0000-0000-000000000001",
        queue="mail",
    )


def failure(
    j: Job,
    status: str,
    kind: FailureKind,
    delay_s: float = 0.0,
    error: str = "Traceback ...\nboom",
    summary: str | None = "ValueError: boom",
) -> Failure:
    return Failure(j.id, j.token, Outcome(status, delay_s, error), j, kind, summary)


def written(j: Job, status: str) -> FailedWrite:
    return FailedWrite(
        j.id, status, j.attempts, "pod-a", LOCKED_AT, RUN_AT if status == "queued" else None
    )


class JobLines:
    """The records of the job-outcome logger only: a record another logger emits meanwhile (say
    asyncio's, when garbage collection finalises a task of an earlier test) is not ours."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog

    @property
    def records(self) -> list[logging.LogRecord]:
        return [r for r in self._caplog.records if r.name == "dispatcher.jobs"]


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.DEBUG, logger="dispatcher.jobs")
    return JobLines(caplog)


def test_a_retried_attempt_is_a_warning_with_the_databases_next_run_time(log):
    j = job(42)
    joblog.failures_written(
        [failure(j, "queued", FailureKind.ERROR, 4.2134)], [written(j, "queued")]
    )
    [r] = log.records
    assert (r.levelno, r.getMessage()) == (
        logging.WARNING,
        "job 42 failed (attempt 2/5); retrying in 4.21 s",
    )
    assert (r.job_id, r.job_type, r.queue, r.bucket, r.attempt, r.max_attempts) == (
        42,
        "send_email",
        "mail",
        17,
        2,
        5,
    )
    assert (r.outcome, r.reason, r.error) == ("queued", "error", "ValueError: boom")
    assert (r.retry_in_s, r.next_run_at) == (4.213, "2025-01-31T09:14:07.201Z")


@pytest.mark.parametrize(
    "kind, status, level, text",
    [
        (
            FailureKind.TIMEOUT,
            "queued",
            logging.WARNING,
            "job 1 timed out (attempt 2/5); retrying in 3 s",
        ),
        (
            FailureKind.INTERRUPTED,
            "queued",
            logging.WARNING,
            "job 1 was interrupted by this worker's shutdown (attempt 2/5); "
            "queued again, due in 3 s",
        ),
        (
            FailureKind.ERROR,
            "failed",
            logging.ERROR,
            "job 1 failed for good: its last attempt (2/5) failed",
        ),
        (
            FailureKind.TIMEOUT,
            "failed",
            logging.ERROR,
            "job 1 failed for good: its last attempt (2/5) timed out",
        ),
        (
            FailureKind.INTERRUPTED,
            "failed",
            logging.ERROR,
            "job 1 failed for good: its last attempt (2/5) was interrupted by shutdown",
        ),
        (
            FailureKind.UNKNOWN_TYPE,
            "failed",
            logging.ERROR,
            "job 1 failed: no handler for its job type in this worker (attempt 2/5); not retried",
        ),
        (
            FailureKind.PERMANENT,
            "discarded",
            logging.ERROR,
            "job 1 discarded: its handler raised PermanentJobError (attempt 2/5)",
        ),
    ],
)
def test_each_outcome_has_its_own_wording_and_level(log, kind, status, level, text):
    j = job(1)
    joblog.failures_written([failure(j, status, kind, 3.0)], [written(j, status)])
    [r] = log.records
    assert (r.levelno, r.getMessage(), r.reason, r.outcome) == (level, text, kind.value, status)
    assert hasattr(r, "next_run_at") == (status == "queued")


def test_a_fenced_failure_is_not_logged_as_ours(log):
    a, b = job(1), job(2)
    joblog.failures_written(
        [failure(a, "queued", FailureKind.ERROR), failure(b, "queued", FailureKind.ERROR)],
        [written(b, "queued")],
    )
    assert [r.job_id for r in log.records] == [2]


def test_without_a_summary_the_first_line_of_the_error_is_used(log):
    j = job(1)
    joblog.failures_written(
        [
            failure(
                j, "queued", FailureKind.TIMEOUT, error="timed out after 5 s\nmore", summary=None
            )
        ],
        [written(j, "queued")],
    )
    assert log.records[0].error == "timed out after 5 s"


def test_a_reaped_job_names_its_old_owner_and_since_when(log):
    expired = [
        ExpiredLease(7, "t", 3, 3, 2, "pod-a", LOCKED_AT),
        ExpiredLease(8, "t", 1, 3, 1, "pod-a", LOCKED_AT),
    ]
    failures = [
        Failure(7, "t", Outcome("failed", 0.0, "lease expired 2 times: ...")),
        Failure(8, "t", Outcome("queued", 1.5, "lease expired once: its worker died or stalled")),
    ]
    rows = [
        FailedWrite(7, "failed", 3, "pod-a", LOCKED_AT, RUN_AT, "send_email", "mail", 17, 3),
        FailedWrite(8, "queued", 1, "pod-a", LOCKED_AT, RUN_AT, "send_email", "mail", 4, 3),
    ]
    joblog.reaped(rows, failures, expired)
    final, retried = log.records
    assert (final.levelno, final.getMessage()) == (
        logging.ERROR,
        "reaped job 7 failed for good: its lease expired on its last attempt (3/3)",
    )
    assert (retried.levelno, retried.getMessage()) == (
        logging.WARNING,
        "reaped job 8: its lease expired (attempt 1/3); retrying in 1.5 s",
    )
    for r in log.records:
        assert (r.old_owner, r.locked_since, r.reason, r.job_type, r.queue) == (
            "pod-a",
            "2025-01-31T09:13:00.000Z",
            "lease_expired",
            "send_email",
            "mail",
        )
    assert (final.lease_expiries, retried.lease_expiries, retried.next_run_at) == (
        2,
        1,
        "2025-01-31T09:14:07.201Z",
    )
    assert retried.error == "lease expired once: its worker died or stalled"


class CustomError(Exception):
    pass


@pytest.mark.parametrize(
    "exc, line",
    [
        (ValueError("boom"), "ValueError: boom"),
        (ValueError("first\nsecond"), "ValueError: first"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (CustomError("x"), "tests.unit.test_joblog.CustomError: x"),
    ],
)
def test_exception_line(exc, line):
    assert joblog.exception_line(exc) == line
