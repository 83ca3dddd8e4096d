"""DISPATCHER_COMPLETED_JOBS without a database: the setting (default, section, bad values), what
`dispatcher status` renders under each value, and the in-memory store and runner under delete."""

from __future__ import annotations

import pytest

from dispatcher import Registry, enqueue_sync
from dispatcher.api.status import render_status
from dispatcher.errors import ConfigError
from dispatcher.model import STATUSES
from dispatcher.settings.config import Config, settings
from dispatcher.settings.sections import COMPLETION
from dispatcher.testing import MemoryStore, Runner


def test_the_default_keeps_completed_rows_and_the_setting_is_the_completers():
    config = Config()
    assert config.completed_jobs == "keep" and config.completion.completed_jobs == "keep"
    assert not config.completion.deletes
    (s,) = [s for s in settings() if s.name == "completed_jobs"]
    assert (s.env_var, s.section, s.default_text) == (
        "DISPATCHER_COMPLETED_JOBS",
        COMPLETION,
        "keep",
    )
    assert "keep" in s.help and "delete" in s.help


def test_delete_from_the_environment_or_a_flag():
    assert Config.load({"DISPATCHER_COMPLETED_JOBS": "delete"}).completion.deletes
    assert Config.load({}, completed_jobs="delete").completion.deletes
    assert not Config.load(
        {"DISPATCHER_COMPLETED_JOBS": "delete"}, completed_jobs="keep"
    ).completion.deletes


def test_delete_changes_no_retention():
    """0 still means 'kept forever' for completed rows under keep; delete does not touch it."""
    config = Config(completed_jobs="delete", completed_retention_s=0)
    assert config.retention.retentions_s["completed"] == 0
    assert Config().retention.retentions_s["completed"] == 3600


@pytest.mark.parametrize("bad", ["drop", "Delete", "true", ""])
def test_a_bad_value_is_refused_naming_the_setting_and_the_allowed_values(bad):
    with pytest.raises(ConfigError) as direct:
        Config(completed_jobs=bad)
    assert direct.value.setting == "completed_jobs"
    if bad:  # an empty env var is "unset"
        with pytest.raises(ConfigError) as loaded:
            Config.load({"DISPATCHER_COMPLETED_JOBS": bad})
        assert loaded.value.setting == "DISPATCHER_COMPLETED_JOBS"
        assert "keep, delete" in str(loaded.value) and repr(bad) in str(loaded.value)
    with pytest.raises(ConfigError) as flagged:
        Config.load({}, completed_jobs=bad or "x")
    assert flagged.value.setting == "--completed-jobs"


def _status(completed: int, completed_jobs: str) -> dict:
    counts = dict.fromkeys(STATUSES, 0) | {"completed": completed, "queued": 3}
    return {
        "completed_jobs": completed_jobs,
        "queues": {"default": {"counts": counts, "oldest_runnable_age_s": 1.0}},
        "runnable_by_bucket": {},
        "db": None,
    }


def test_status_under_keep_shows_the_count():
    text = render_status(_status(0, "keep"))
    assert "deleted" not in text and "DISPATCHER_COMPLETED_JOBS" not in text


def test_status_under_delete_says_completed_rows_are_deleted_instead_of_a_misleading_zero():
    text = render_status(_status(0, "delete"))
    row = text.splitlines()[1].split()
    assert row[STATUSES.index("completed") + 1] == "deleted*"
    assert "DISPATCHER_COMPLETED_JOBS=delete deletes a job's row when it completes" in text
    # rows from before the switch
    leftover = render_status(_status(7, "delete")).splitlines()[1].split()
    assert leftover[STATUSES.index("completed") + 1] == "7*"


def test_the_memory_store_under_delete_removes_a_completed_job_and_keeps_a_failed_one():
    store, registry = MemoryStore(completed_jobs="delete"), Registry()

    @registry.handler("ok")
    def ok(job):
        return None

    @registry.handler("bad")
    def bad(job):
        raise ValueError("no")

    done = enqueue_sync(store, "ok", {})
    failed = enqueue_sync(store, "bad", {}, max_attempts=1)
    attempts = Runner(store, registry).drain()
    assert sorted((a.job_id, a.status) for a in attempts) == [
        (done, "completed"),
        (failed, "failed"),
    ]
    assert store.get(done) is None and [j.id for j in store.jobs()] == [failed]


def test_the_memory_store_refuses_an_unknown_value():
    with pytest.raises(ValueError, match="keep, delete"):
        MemoryStore(completed_jobs="drop")
