"""The readiness rule, /livez's judgement of the loop heartbeat, and the scrape-time collectors
(health.py, table_sampler.py, coordinator/metrics.py), without servers."""

import asyncio
import math
import time
from types import SimpleNamespace

import pytest

from coordinator.metrics import _HeartbeatAge
from dispatcher.db.rows import DbPressure, QueueDepth
from dispatcher.runtime.table_sampler import (
    DEPTH_STATUSES,
    STALE_TICKS,
    TableCollector,
    TableSample,
    TableSampler,
    WorkerCount,
)
from dispatcher.runtime.vitals import Vitals
from dispatcher.serve.health import Health, HealthCollector, assignment_state, judge
from tests.helpers import collected

READY = dict(worker="running", database="ok", schema="current", assignment="owned")


def test_ready_only_when_every_check_passes():
    assert judge(**READY).ready
    # degraded by design: SKIP LOCKED still works
    assert judge(**{**READY, "assignment": "degraded"}).ready
    assert judge(**{**READY, "assignment": "not used"}).ready
    for check, state in [
        ("worker", "starting"),
        ("worker", "stopping"),
        ("worker", "stalled"),
        ("database", "failing"),
        ("database", "unreachable"),
        ("schema", "missing"),
        ("schema", "older"),
        ("schema", "unreadable"),
        ("assignment", "joining"),
        ("assignment", "resigned"),
        ("assignment", "stopped"),
        ("assignment", "not started"),
    ]:
        readiness = judge(**{**READY, check: state})
        assert not readiness.ready, (check, state)
        assert readiness.body() == {"status": "not ready", "checks": {**READY, check: state}}


@pytest.mark.parametrize(
    "coordinated, states, expected",
    [
        (False, ["member"], "not used"),  # SKIP LOCKED mode, or the static coordinator
        (True, ["member", "member"], "owned"),
        (True, ["member", "degraded"], "degraded"),
        (True, ["degraded", "joining"], "joining"),  # the worst queue decides
        (True, ["member", "resigned"], "resigned"),
        (True, ["stopped", "resigned"], "stopped"),
        (True, [], "not started"),
    ],
)
def test_the_assignment_check(coordinated, states, expected):
    assert assignment_state(coordinated, states) == expected


def coordinated_vitals(*states: str) -> Vitals:
    """What a worker whose coordinators are in `states` writes (Worker.__init__)."""
    return Vitals(coordinated=True, assignments=tuple(SimpleNamespace(state=s) for s in states))


def test_readiness_follows_the_vitals_from_start_to_stop():
    health = Health(loop_stall_s=10, vitals=coordinated_vitals("member"))
    vitals = health.vitals
    assert health.readiness().checks == {
        "worker": "starting",
        "database": "unknown",
        "schema": "unknown",
        "assignment": "not started",
    }
    health.startup.update("ok", "missing")  # what startup.wait_until_ready reports
    assert health.readyz() == (
        503,
        {
            "status": "not ready",
            "checks": {
                "worker": "starting",
                "database": "ok",
                "schema": "missing",
                "assignment": "not started",
            },
            "paused_queues": [],
        },
    )
    health.startup.update("ok", "current")
    vitals.started = True
    assert health.readyz() == (200, {"status": "ready", "checks": READY, "paused_queues": []})
    vitals.assignments[0].state = "degraded"
    assert health.readyz()[0] == 200
    vitals.stopping = True
    assert health.readyz() == (
        503,
        {
            "status": "not ready",
            "checks": {**READY, "worker": "stopping", "assignment": "degraded"},
            "paused_queues": [],
        },
    )


@pytest.mark.parametrize(
    "failing", ["claims_failing_since", "heartbeats_failing_since", "reaper_failing_since"]
)
def test_a_failing_statement_in_the_vitals_fails_the_database_check_until_it_works_again(failing):
    health = Health(loop_stall_s=10, vitals=Vitals(started=True))
    health.startup.update("ok", "current")
    assert (
        health.readiness().checks == {**READY, "assignment": "not used"}
        and health.readiness().ready
    )
    setattr(health.vitals, failing, time.monotonic())
    assert health.readiness().checks["database"] == "failing" and not health.readiness().ready
    setattr(health.vitals, failing, None)
    assert health.readiness().ready


def test_the_vitals_say_when_the_worker_cannot_work():
    vitals = Vitals()
    assert vitals.failing_since is None and not vitals.stalled and not vitals.database_failing
    # the reaper's failures count for readiness, not for membership
    vitals.reaper_failing_since = 5.0
    assert vitals.failing_since is None and vitals.database_failing
    vitals.claims_failing_since, vitals.heartbeats_failing_since = 7.0, 6.0
    assert vitals.failing_since == 6.0 and vitals.stalled  # the first of them


def test_livez_judges_the_age_of_the_loop_heartbeat():
    health = Health(loop_stall_s=10)
    # the loop has not started
    assert health.livez() == (200, {"status": "ok", "loop_heartbeat_age_s": None})
    health._beat = time.monotonic() - 0.5
    code, body = health.livez()
    assert code == 200 and 0.5 <= body["loop_heartbeat_age_s"] < 10
    health._beat = time.monotonic() - 11
    code, body = health.livez()
    assert code == 503 and body["status"] == "stalled" and body["loop_heartbeat_age_s"] >= 11
    health.vitals.started = True
    health.startup.update("ok", "current")
    assert health.readiness().checks["worker"] == "stalled"


def test_the_loop_heartbeat_task_stamps_the_loop_time():
    health = Health(loop_stall_s=10)

    async def main():
        task = asyncio.create_task(health.beat_forever())
        await asyncio.sleep(0)
        age = health.loop_age_s()
        task.cancel()
        return age

    assert 0 <= asyncio.run(main()) < 1


def test_ready_and_loop_age_are_computed_at_scrape_time():
    collector = HealthCollector()
    assert collected(collector) == {}  # no worker in this process: no samples
    health = Health(loop_stall_s=10)
    collector.track(health)
    health._beat = time.monotonic() - 3
    out = collected(collector)
    assert out[("dispatcher_ready", ())] == 0
    assert out[("dispatcher_loop_heartbeat_age_seconds", ())] >= 3
    health._beat = time.monotonic() - 7
    # grows between scrapes
    assert collected(collector)[("dispatcher_loop_heartbeat_age_seconds", ())] >= 7


def test_coordinator_heartbeat_age_is_computed_at_scrape_time_and_absent_without_a_coordinator():
    ages = _HeartbeatAge()
    assert collected(ages) == {}

    class Beating:
        def __init__(self, age_s):
            self.age_s = age_s

        def heartbeat_age_s(self):
            return self.age_s

    beating = [Beating(1.5), Beating(4.0)]
    for c in beating:
        ages.track(c)
    # the oldest group's
    assert collected(ages) == {("dispatcher_coordinator_heartbeat_age_seconds", ()): 4.0}
    ages.untrack(beating[1])
    assert collected(ages) == {("dispatcher_coordinator_heartbeat_age_seconds", ()): 1.5}


TABLE_WIDE = {
    "dispatcher_queue_jobs",
    "dispatcher_queue_halted_keys",
    "dispatcher_queue_oldest_runnable_age_seconds",
    "dispatcher_db_dead_tuples",
    "dispatcher_db_live_tuples",
    "dispatcher_db_claim_index_tuples_read_total",
    "dispatcher_db_lock_waits",
    "dispatcher_db_active_sessions",
    "dispatcher_workers",
}


def sampler(interval_s=1.0, queues=("default", "mail")):
    return TableSampler(SimpleNamespace(), interval_s=interval_s, queues=queues)


def sample(age_s=0.0):
    depth = (
        QueueDepth("default", "queued", 5, 12.5),
        QueueDepth("default", "scheduled", 2, None),
        QueueDepth("other", "failed", 1, None),
        QueueDepth("other", "halted", 1, None),
    )
    return TableSample(depth, DbPressure(100, 7, 0, 0, 0, 0, 12345, 2, 3), time.monotonic() - age_s)


def test_the_table_collector_exports_the_holders_fresh_sample_only():
    collector = TableCollector()
    s = sampler()
    collector.track(s)
    out = collected(collector)
    assert out == {
        ("dispatcher_table_sampler", ()): 0,
        ("dispatcher_table_sample_age_seconds", ()): math.inf,
    }

    # what a tick that holds the lease leaves
    s.sample, s._held_until = sample(age_s=0.25), time.monotonic() + 3
    out = collected(collector)
    assert out[("dispatcher_table_sampler", ())] == 1
    assert 0.25 <= out[("dispatcher_table_sample_age_seconds", ())] < 5
    jobs = {
        tuple(v for _, v in labels): n
        for (name, labels), n in out.items()
        if name == "dispatcher_queue_jobs"
    }
    # Every status of every known queue (configured, or seen in a sample) is exported, 0 when empty.
    expected = {(q, status): 0 for q in ("default", "mail", "other") for status in DEPTH_STATUSES}
    expected.update({("default", "queued"): 5, ("default", "scheduled"): 2, ("other", "failed"): 1})
    assert jobs == expected
    assert set(DEPTH_STATUSES) == {
        "queued",
        "scheduled",
        "running",
        "failed",
        "discarded",
        "cancelled",
        "waiting",
    }
    halted = {
        dict(labels)["queue"]: v
        for (name, labels), v in out.items()
        if name == "dispatcher_queue_halted_keys"
    }
    assert halted == {"default": 0, "mail": 0, "other": 1}, (
        "a gauge of its own: the jobs count as failed"
    )
    oldest = {
        dict(labels)["queue"]: v
        for (name, labels), v in out.items()
        if name == "dispatcher_queue_oldest_runnable_age_seconds"
    }
    assert oldest == {"default": 12.5, "mail": 0.0, "other": 0.0}
    assert out[("dispatcher_db_claim_index_tuples_read_total", ())] == 12345  # a counter now
    assert (out[("dispatcher_db_live_tuples", ())], out[("dispatcher_db_dead_tuples", ())]) == (
        100,
        7,
    )
    assert (out[("dispatcher_db_lock_waits", ())], out[("dispatcher_db_active_sessions", ())]) == (
        2,
        3,
    )

    s.sample = sample(age_s=STALE_TICKS * s.interval_s + 0.5)  # the database stopped answering
    out = collected(collector)
    assert not {name for name, _ in out} & TABLE_WIDE
    assert out[("dispatcher_table_sampler", ())] == 1

    s.sample, s._held_until = sample(), time.monotonic() - 0.1  # the lease ran out: held no more
    out = collected(collector)
    assert out == {
        ("dispatcher_table_sampler", ()): 0,
        ("dispatcher_table_sample_age_seconds", ()): math.inf,
    }


def test_the_holder_exports_the_registrys_live_workers_per_mode_and_coordinator():
    collector = TableCollector()
    s = sampler()
    collector.track(s)
    counts = (WorkerCount("partitioned", "postgres", 2), WorkerCount("skip_locked", "none", 0))
    base = sample()
    s.sample = TableSample(base.depth, base.pressure, base.taken_at, counts)
    s._held_until = time.monotonic() + 3
    workers = {
        labels: n
        for (name, labels), n in collected(collector).items()
        if name == "dispatcher_workers"
    }
    assert workers == {
        (("coordinator", "postgres"), ("mode", "partitioned")): 2,
        (("coordinator", "none"), ("mode", "skip_locked")): 0,
    }
    s._held_until = time.monotonic() - 0.1  # another pod holds the role: it exports them
    assert not [k for k in collected(collector) if k[0] == "dispatcher_workers"]
