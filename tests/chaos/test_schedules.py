"""Recurring jobs across a fleet of real worker processes: exactly one job per slot whatever dies.

An every-second schedule (tests/apps/scheduled.py) runs on three workers for 20 s; at 10 s the
worker holding the queue's schedules lease is killed (SIGKILL) and a fourth joins. Then every
worker stops for longer than the scheduler enqueues ahead, and one comes back: each catch_up
policy does with the missed slots what it says. Slots and times are the database's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from dispatcher.api.schedules.scheduler import LEASE_PREFIX, Scheduler
from tests.helpers import fetchall, fetchval, wait_until

pytestmark = pytest.mark.chaos

APP = "tests.apps.scheduled:registry"
CATCH_UP_APP = "tests.apps.scheduled:catch_up_registry"
# A 2 s job lease: a killed worker's claimed ticks come back within seconds.
OPTS = dict(lease_s=2.0, coordinator_lease_s=3, coordinator_poll_s=0.5, shutdown_grace_s=5)
SECOND = timedelta(seconds=1)


def db_now(dsn: str) -> datetime:
    return fetchval(dsn, "SELECT clock_timestamp()")


def holder(dsn: str) -> str | None:
    return fetchval(
        dsn,
        "SELECT holder FROM dispatcher_maintenance_leases WHERE name = %s AND expires_at > now()",
        (LEASE_PREFIX + "default",),
    )


def jobs_by_slot(dsn: str, schedule: str | None = None) -> dict[datetime, list[tuple[int, str]]]:
    """slot -> [(job id, status)] of the schedule's jobs (all of them: completed rows are kept)."""
    rows = fetchall(
        dsn,
        "SELECT r.slot_at, j.id, j.status, j.scheduled_for FROM dispatcher_schedule_runs r "
        "JOIN dispatcher_jobs j ON j.id = r.job_id WHERE %s::text IS NULL OR r.schedule_name = %s",
        (schedule, schedule),
    )
    found: dict[datetime, list[tuple[int, str]]] = {}
    for slot, job_id, status, scheduled_for in rows:
        assert scheduled_for == slot, f"job {job_id} carries {scheduled_for}, its slot is {slot}"
        found.setdefault(slot, []).append((job_id, status))
    return found


def jobs_without_a_slot(dsn: str) -> int:
    """Tick jobs no slot row points at, slot rows pointing at no job, and slot rows pointing at a
    job another one does too: one statement, so the scheduler enqueueing meanwhile (a slot row and
    its job in one transaction) cannot skew it."""
    return fetchval(
        dsn,
        "SELECT (SELECT count(*) FROM dispatcher_jobs j WHERE j.job_type = 'tick' AND NOT EXISTS "
        "(SELECT 1 FROM dispatcher_schedule_runs r WHERE r.job_id = j.id)) "
        "+ (SELECT count(*) FROM dispatcher_schedule_runs r WHERE NOT EXISTS "
        "(SELECT 1 FROM dispatcher_jobs j WHERE j.id = r.job_id)) "
        "+ (SELECT count(*) - count(DISTINCT job_id) FROM dispatcher_schedule_runs)",
    )


def recorded_slots(record_dir: Path) -> dict[int, set[float]]:
    """job id -> the slots its handler saw (each execution's job.scheduled_for)."""
    seen: dict[int, set[float]] = {}
    for path in record_dir.glob("slots-*.log"):
        for line in path.read_text().splitlines():
            job_id, slot, _start, _pid = line.split()
            seen.setdefault(int(job_id), set()).add(float(slot))
    return seen


def test_one_job_per_slot_through_a_kill_9_of_the_lease_holder_and_a_join(chaos_dsn, workers):
    fleet = {f"s{i}": workers.start(chaos_dsn, f"s{i}", app=APP, **OPTS) for i in range(3)}
    for worker in fleet.values():
        worker.wait_for_log(r"worker s\d running", 30)
    began = db_now(chaos_dsn)
    first_holder = wait_until(lambda: holder(chaos_dsn), 15, "a worker to hold the schedules lease")
    wait_until(lambda: db_now(chaos_dsn) >= began + 10 * SECOND, 30, "10 s of the schedule")

    victim = fleet[holder(chaos_dsn) or first_holder]
    victim.kill()
    killed_at = db_now(chaos_dsn)
    workers.start(chaos_dsn, "s3", app=APP, **OPTS)
    wait_until(lambda: db_now(chaos_dsn) >= began + 20 * SECOND, 40, "20 s of the schedule")
    successor = wait_until(
        lambda: (h := holder(chaos_dsn)) not in (None, victim.name) and h,
        30,
        lambda: f"another worker to take the lease over:\n{workers.log_tails()}",
    )
    last_due = db_now(chaos_dsn) - SECOND
    first = min(jobs_by_slot(chaos_dsn))
    expected = {first + k * SECOND for k in range(int((last_due - first) / SECOND) + 1)}
    wait_until(
        lambda: (
            all(
                s == "completed"
                for slot, runs in jobs_by_slot(chaos_dsn).items()
                if slot in expected
                for _, s in runs
            )
            and expected <= set(jobs_by_slot(chaos_dsn))
        ),
        60,
        lambda: f"every due slot's job completed:\n{workers.log_tails()}",
    )

    # Exactly one job per slot, none missed: through the kill, the take-over and the join.
    by_slot = jobs_by_slot(chaos_dsn)
    assert first <= began + 2 * SECOND, (
        f"the first slot ({first}) came late after the start ({began})"
    )
    assert not [s for s in expected if len(by_slot.get(s, [])) != 1], sorted(
        (s, by_slot.get(s)) for s in expected if len(by_slot.get(s, [])) != 1
    )[:5]
    assert len(by_slot) == sum(len(v) for v in by_slot.values()), "a slot with two jobs"
    assert jobs_without_a_slot(chaos_dsn) == 0, "a job without its slot's row"
    assert killed_at < last_due - 5 * SECOND, "the test did not run long enough after the kill"
    # Each job carried its slot to its handler (every execution of it, re-runs included).
    seen = recorded_slots(workers.record_dir)
    for slot in expected:
        ((job_id, _),) = by_slot[slot]
        assert seen.get(job_id) == {slot.timestamp()}, (job_id, slot, seen.get(job_id))
    assert successor != victim.name
    assert {name: code for name, code in workers.stop_all().items()} == {
        name: 0 for name in ("s0", "s1", "s2", "s3") if name != victim.name
    }, workers.log_tails()


def test_catch_up_policies_after_every_worker_stopped(chaos_dsn, workers):
    worker = workers.start(chaos_dsn, "c0", app=CATCH_UP_APP, **OPTS)
    wait_until(
        lambda: len(jobs_by_slot(chaos_dsn, "catch-up-none")) >= 3,
        30,
        lambda: f"the schedules' first slots:\n{worker.log_tail()}",
    )
    assert worker.stop() == 0
    stopped_at = db_now(chaos_dsn)
    ahead = {p: max(jobs_by_slot(chaos_dsn, f"catch-up-{p}")) for p in ("latest", "all", "none")}
    # Every slot enqueued ahead is a job like any other; the ones after it were missed. Off long
    # enough that at least 4 slots past the last enqueued one were missed by every schedule.
    wait_until(
        lambda: db_now(chaos_dsn) > max(ahead.values()) + (Scheduler.LATE_S + 4) * SECOND,
        40,
        "the fleet to be down past the slots enqueued ahead",
    )
    assert max(ahead.values()) <= stopped_at + (Scheduler.LOOKAHEAD_S + 1) * SECOND

    back = workers.start(chaos_dsn, "c1", app=CATCH_UP_APP, **OPTS)
    wait_until(
        lambda: all(max(jobs_by_slot(chaos_dsn, f"catch-up-{p}")) > ahead[p] for p in ahead),
        30,
        lambda: f"the schedules to go on:\n{back.log_tail()}",
    )
    # The first round after the restart: one transaction, one now() for the queue's schedules.
    round_at = min(
        fetchval(
            chaos_dsn,
            "SELECT min(enqueued_at) FROM dispatcher_schedule_runs "
            "WHERE schedule_name = %s AND slot_at > %s",
            (f"catch-up-{p}", ahead[p]),
        )
        for p in ahead
    )
    missed_until = round_at - Scheduler.LATE_S * SECOND
    missed = {
        p: sorted(
            s for s in jobs_by_slot(chaos_dsn, f"catch-up-{p}") if ahead[p] < s <= missed_until
        )
        for p in ahead
    }
    gap = {p: int((missed_until - ahead[p]) / SECOND) for p in ahead}  # slots missed by each
    assert min(gap.values()) >= 4, gap
    assert missed["none"] == [], missed["none"]
    assert len(missed["latest"]) == 1 and missed["latest"][0] > missed_until - SECOND, missed[
        "latest"
    ]
    assert missed["all"] == [ahead["all"] + k * SECOND for k in range(1, gap["all"] + 1)], (
        missed["all"],
        gap,
    )
    # And from there on, each schedule goes on slot by slot, each slot once.
    runs = fetchall(
        chaos_dsn,
        "SELECT schedule_name, slot_at, count(*) FROM dispatcher_schedule_runs "
        "GROUP BY 1, 2 HAVING count(*) > 1",
    )
    assert runs == []
    assert jobs_without_a_slot(chaos_dsn) == 0, "a job without its slot's row, or one more"
    assert back.stop() == 0
