"""Which slots a scheduler round enqueues (round.plan_slots): ahead of time, and the
missed ones by each catch_up policy; and the declarations a registry accepts or refuses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher import Registry
from dispatcher.api.schedules.declarations import CATCH_UP_ALL_MAX, declare_schedule
from dispatcher.api.schedules.round import MAX_SLOTS_PER_ROUND, plan_slots
from dispatcher.api.schedules.slots import Cadence, ScheduleError

NOW = datetime(2026, 11, 26, 12, 0, 0, 400_000, tzinfo=UTC)
S = timedelta(seconds=1)


def plan(cadence, catch_up, cursor, now=NOW, lookahead_s=10.0, late_s=2.0):
    return plan_slots(cadence, catch_up, cursor, now, lookahead_s=lookahead_s, late_s=late_s)


def whole(t: datetime) -> datetime:
    return t.replace(microsecond=0)


@pytest.mark.parametrize("catch_up", ["latest", "all", "none"])
def test_on_time_every_slot_up_to_the_lookahead_is_enqueued_whatever_the_policy(catch_up):
    every = Cadence.parse(every_s=1)
    cursor = every.next_after(NOW)
    p = plan(every, catch_up, cursor)
    assert p.enqueue == [whole(NOW) + k * S for k in range(1, 11)]
    assert p.next_slot_at == whole(NOW) + 11 * S and p.missed is None
    # A round a moment later enqueues only what came within reach: each slot once.
    later = plan(every, catch_up, p.next_slot_at, now=NOW + 1.5 * S)
    assert later.enqueue == [whole(NOW) + 11 * S]


@pytest.mark.parametrize("catch_up", ["latest", "all", "none"])
def test_a_slot_found_less_than_late_s_late_still_runs(catch_up):
    every = Cadence.parse(every_s=1)
    p = plan(every, catch_up, whole(NOW) - S)  # 1.4 s late, late_s 2
    assert p.enqueue[0] == whole(NOW) - S and p.missed is None


def test_missed_slots_by_policy():
    every = Cadence.parse(every_s=1)
    cursor = whole(NOW) - 30 * S  # the fleet was down for half a minute
    latest, everything, nothing = (plan(every, c, cursor) for c in ("latest", "all", "none"))
    last_missed = whole(NOW) - 2 * S  # the latest slot at or before now - late_s
    assert latest.enqueue[0] == last_missed and latest.missed_run == 1
    assert latest.missed == (cursor, last_missed)
    assert (
        everything.enqueue[:29] == [cursor + k * S for k in range(29)]
        and everything.missed_run == 29
    )
    assert everything.missed is None
    assert nothing.enqueue[0] == last_missed + S and nothing.missed_run == 0
    assert nothing.missed == (cursor, NOW - 2 * S)
    # After the missed ones, each policy goes on from the same next slot.
    for p in (latest, everything, nothing):
        assert [s for s in p.enqueue if s > last_missed] == [
            last_missed + k * S for k in range(1, 13)
        ]


def test_all_is_bounded_to_the_latest_slots():
    every = Cadence.parse(every_s=1)
    p = plan(every, "all", whole(NOW) - 10_000 * S)
    assert p.missed_run == CATCH_UP_ALL_MAX
    assert p.enqueue[CATCH_UP_ALL_MAX - 1] == whole(NOW) - 2 * S
    assert p.missed == (whole(NOW) - 10_000 * S, p.enqueue[0])


def test_a_daily_schedule_after_a_two_day_outage_runs_once_with_latest():
    daily = Cadence.parse("0 3 * * *", tz="Europe/Paris")
    now = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
    cursor = datetime(2026, 11, 24, 2, 0, tzinfo=UTC)  # 03:00 CET two days ago
    p = plan(daily, "latest", cursor, now=now)
    assert p.enqueue == [datetime(2026, 11, 26, 2, 0, tzinfo=UTC)]
    assert p.next_slot_at == datetime(2026, 11, 27, 2, 0, tzinfo=UTC)
    assert plan(daily, "all", cursor, now=now).enqueue == [cursor + k * 86400 * S for k in range(3)]
    assert plan(daily, "none", cursor, now=now).enqueue == []


def test_one_round_enqueues_a_bounded_number_of_slots():
    every = Cadence.parse(every_s=1)
    p = plan(every, "all", every.next_after(NOW), lookahead_s=3600)
    assert len(p.enqueue) == MAX_SLOTS_PER_ROUND and p.next_slot_at == p.enqueue[-1] + S


# -- declarations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(name="bad name", every_s=1, job_type="t"), "schedule name"),
        (
            dict(name="s", expression="61 * * * *", job_type="t"),
            "schedule 's': bad cron expression",
        ),
        (dict(name="s", expression="@reboot", job_type="t"), "@reboot"),
        (dict(name="s", every_s=0, job_type="t"), "every_s"),
        (dict(name="s", job_type="t"), "exactly one"),
        (dict(name="s", expression="0 3 * * *", job_type="t", tz="Mars/Base"), "unknown time zone"),
        (dict(name="s", every_s=1, job_type="bad type"), "job_type"),
        (dict(name="s", every_s=1, job_type="t", queue="a:b"), "queue"),
        (dict(name="s", every_s=1, job_type="t", priority=40_000), "priority"),
        (dict(name="s", every_s=1, job_type="t", max_attempts=0), "max_attempts"),
        (dict(name="s", every_s=1, job_type="t", catch_up="some"), "catch_up"),
        (dict(name="s", every_s=1, job_type="t", payload={"x": float("nan")}), "NaN"),
        (dict(name="s", every_s=1, job_type="t", payload={1, 2}), "JSON"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_schedule(kwargs, words):
    with pytest.raises(ScheduleError, match=words):
        declare_schedule(**kwargs)


def test_the_registry_declares_schedules_and_checks_their_handlers():
    registry = Registry()

    @registry.handler("report", schedule="@hourly")
    async def report(job):  # pragma: no cover - never run
        pass

    registry.schedule(
        "nightly", "0 3 * * *", job_type="report", tz="Europe/Paris", payload={"kind": "full"}
    )
    assert [s.name for s in registry.schedules()] == ["nightly", "report"]
    assert registry.schedules()[1].cadence.text == "0 * * * *"
    registry.check_schedules()
    with pytest.raises(ScheduleError, match="declared twice"):
        registry.schedule("nightly", every_s=5, job_type="report")
    registry.schedule("orphan", every_s=5, job_type="cleanup")
    with pytest.raises(ScheduleError, match="schedule 'orphan': job_type 'cleanup' has no handler"):
        registry.check_schedules()


def test_the_fingerprint_changes_with_every_part_of_a_declaration():
    base = dict(name="s", expression="0 3 * * *", job_type="t")
    prints = {declare_schedule(**base).fingerprint}
    for change in (
        dict(expression="0 4 * * *"),
        dict(tz="Europe/Paris"),
        dict(job_type="u"),
        dict(payload={"a": 1}),
        dict(queue="q"),
        dict(priority=1),
        dict(max_attempts=3),
        dict(catch_up="none"),
    ):
        prints.add(declare_schedule(**{**base, **change}).fingerprint)
    assert len(prints) == 9
    assert declare_schedule(**base).fingerprint == declare_schedule(**base).fingerprint
