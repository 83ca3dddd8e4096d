"""Test handlers and enqueue code without PostgreSQL: an in-memory job store, a runner, a fake
clock.

    from dispatcher import enqueue_sync
    from dispatcher.testing import MemoryStore, Runner, assert_enqueued

    store = MemoryStore()
    enqueue_sync(store, "send_email", {"to": "a@example.com"})   # the production call
    assert_enqueued(store, "send_email", {"to": "a@example.com"})
    Runner(store, registry).drain()                              # retries advance the fake clock
    perform_job(send_email, "a@example.com", "Hi")               # one typed task's job, here

Not imported by `dispatcher` itself: workers never load it. Guide: docs/guides/testing.md.
"""

from dispatcher.db.rows import JobState
from dispatcher.testing.assertions import assert_enqueued, enqueued, refute_enqueued
from dispatcher.testing.clock import FakeClock
from dispatcher.testing.memory_store import MemoryStore
from dispatcher.testing.perform import aperform_job, perform_job
from dispatcher.testing.progress import ProgressLog, recorded_progress
from dispatcher.testing.runner import Attempt, Runner

__all__ = [
    "Attempt",
    "FakeClock",
    "JobState",
    "MemoryStore",
    "ProgressLog",
    "Runner",
    "aperform_job",
    "assert_enqueued",
    "enqueued",
    "perform_job",
    "recorded_progress",
    "refute_enqueued",
]
