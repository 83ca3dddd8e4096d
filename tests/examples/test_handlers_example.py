"""Unit tests of job handlers and enqueue code without PostgreSQL: a file to copy.

The same text is in docs/guides/testing.md (tests/unit/test_testing_guide.py keeps them equal).
"""

import pytest

from dispatcher import PermanentJobError, Registry, enqueue_sync
from dispatcher.testing import MemoryStore, Runner, assert_enqueued, refute_enqueued

# -- the application (yours lives in your own modules) ---------------------------------------------

registry = Registry()
sent: list[str] = []  # stands in for a mail service


def sign_up(db, email: str) -> None:
    """Application code. In production `db` is your psycopg connection (the job commits with
    the user's row) or pool; in a unit test, a MemoryStore."""
    enqueue_sync(
        db, "send_welcome", {"email": email}, max_attempts=3, dedupe_key=f"welcome:{email}"
    )


@registry.handler("send_welcome")
def send_welcome(job) -> None:
    email = job.payload["email"]
    if "@" not in email:
        raise PermanentJobError(f"not an address: {email!r}")  # no retry
    if email.startswith("busy") and job.attempts < 2:
        raise ConnectionError("mail server busy")  # retried with backoff
    sent.append(email)


# -- the tests -------------------------------------------------------------------------------------


@pytest.fixture
def store() -> MemoryStore:
    sent.clear()
    return MemoryStore()


def test_sign_up_enqueues_one_welcome_email(store: MemoryStore) -> None:
    sign_up(store, "ada@example.com")
    sign_up(store, "ada@example.com")  # the same dedupe key: still one job
    assert_enqueued(store, "send_welcome", {"email": "ada@example.com"}, count=1)


def test_the_welcome_email_is_sent(store: MemoryStore) -> None:
    sign_up(store, "ada@example.com")
    Runner(store, registry).run_due()
    assert sent == ["ada@example.com"]
    refute_enqueued(store, "send_welcome")  # nothing left queued


def test_a_busy_mail_server_is_retried_later(store: MemoryStore) -> None:
    sign_up(store, "busy@example.com")
    runner = Runner(store, registry)
    [first] = runner.run_due()
    assert first.status == "queued" and sent == []
    job = assert_enqueued(store, "send_welcome")
    assert job.run_at > store.clock.now() and "mail server busy" in job.last_error
    runner.drain()  # moves the fake clock to the retry: no sleeping
    assert sent == ["busy@example.com"]
    assert assert_enqueued(store, "send_welcome", status="completed").attempts == 2


def test_a_bad_address_is_discarded_at_once(store: MemoryStore) -> None:
    sign_up(store, "nobody")
    [attempt] = Runner(store, registry).drain()
    assert attempt.status == "discarded" and sent == []
