"""dispatcher.api.schedules.slots: the next slot of cron expressions and intervals, DST included."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.schedules.slots import Cadence, ScheduleError

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def slots(cadence: Cadence, after: datetime, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        after = cadence.next_after(after)
        out.append(after)
    return out


def slots_between(cadence: Cadence, start: datetime, end: datetime) -> list[datetime]:
    """Slots in (start, end]."""
    out = []
    while (start := cadence.next_after(start)) <= end:
        out.append(start)
    return out


# -- basics ----------------------------------------------------------------------------------------


def test_daily_and_hourly_in_utc():
    daily = Cadence.parse("0 3 * * *")
    assert slots(daily, utc(2026, 5, 1, 12), 2) == [utc(2026, 5, 2, 3), utc(2026, 5, 3, 3)]
    assert daily.next_after(utc(2026, 5, 1, 2, 59, 59)) == utc(2026, 5, 1, 3)
    assert daily.next_after(utc(2026, 5, 1, 3)) == utc(2026, 5, 2, 3)  # strictly after
    hourly = Cadence.parse("0 * * * *")
    assert hourly.next_after(utc(2026, 5, 1, 12, 0, 0, 1)) == utc(2026, 5, 1, 13)


def test_weekdays_skip_the_weekend():
    # 2026-05-01 is a Friday.
    cadence = Cadence.parse("0 9 * * 1-5")
    assert slots(cadence, utc(2026, 5, 1, 10), 2) == [utc(2026, 5, 4, 9), utc(2026, 5, 5, 9)]
    assert Cadence.parse("0 9 * * mon-fri").next_after(utc(2026, 5, 1, 10)) == utc(2026, 5, 4, 9)


def test_day_of_month_or_day_of_week_as_cronsim_does():
    # Neither field starts with "*": the 13th OR a Friday (2026-01: Fridays 2, 9, 16; the 13th a
    # Tuesday).
    assert slots(Cadence.parse("0 0 13 * 5"), utc(2026, 1, 10), 2) == [
        utc(2026, 1, 13),
        utc(2026, 1, 16),
    ]
    # One starts with "*": odd days AND Fridays.
    assert slots(Cadence.parse("0 0 */2 * 5"), utc(2026, 1, 1), 2) == [
        utc(2026, 1, 9),
        utc(2026, 1, 23),
    ]


def test_month_ends_and_leap_day():
    assert Cadence.parse("0 0 31 * *").next_after(utc(2026, 1, 31)) == utc(2026, 3, 31)
    assert Cadence.parse("0 0 L * *").next_after(utc(2026, 2, 1)) == utc(2026, 2, 28)
    assert Cadence.parse("0 0 L * *").next_after(utc(2028, 2, 1)) == utc(2028, 2, 29)
    assert Cadence.parse("0 12 29 2 *").next_after(utc(2026, 3, 1)) == utc(2028, 2, 29, 12)


@pytest.mark.parametrize(
    ("macro", "expanded"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros_expand(macro, expanded):
    cadence = Cadence.parse(macro)
    assert cadence.expression == cadence.text == expanded
    assert cadence.next_after(utc(2026, 5, 1, 12, 30)) == Cadence.parse(expanded).next_after(
        utc(2026, 5, 1, 12, 30)
    )


def test_text_and_fixed_time():
    assert Cadence.parse("  0   3 * *  * ").text == "0 3 * * *"
    assert Cadence.parse(every_s=30).text == "every 30s"
    assert Cadence.parse("30 2 * * *").fixed_time and Cadence.parse("@daily").fixed_time
    assert Cadence.parse("0 9-17 * * 1-5").fixed_time
    for expr in ("*/5 * * * *", "0 * * * *", "* 3 * * *", "@hourly", "0 */2 * * *"):
        assert not Cadence.parse(expr).fixed_time, expr


def test_after_in_any_zone_and_with_microseconds():
    cadence = Cadence.parse("0 3 * * *", tz="Europe/Paris")
    after = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=ZoneInfo("Asia/Tokyo"))
    assert (
        cadence.next_after(after) == cadence.next_after(after.astimezone(UTC)) == utc(2026, 5, 2, 1)
    )
    assert cadence.next_after(after).tzinfo is UTC
    with pytest.raises(ValueError, match="aware"):
        cadence.next_after(datetime(2026, 5, 1))


def test_every_s_is_aligned_to_the_epoch():
    cadence = Cadence.parse(every_s=30, tz="Europe/Paris")
    assert (cadence.time_zone, cadence.expression, cadence.every_s) == ("UTC", None, 30)
    assert cadence.next_after(utc(2026, 5, 1, 12, 0, 10)) == utc(2026, 5, 1, 12, 0, 30)
    assert cadence.next_after(utc(2026, 5, 1, 12, 0, 30)) == utc(2026, 5, 1, 12, 1)
    assert cadence.next_after(datetime(2026, 5, 1, 12, 0, 29, 999999, tzinfo=UTC)) == utc(
        2026, 5, 1, 12, 0, 30
    )
    assert cadence.latest_at_or_before(utc(2026, 5, 1, 12, 1), 3) == [
        utc(2026, 5, 1, 12, 0),
        utc(2026, 5, 1, 12, 0, 30),
        utc(2026, 5, 1, 12, 1),
    ]
    seven = Cadence.parse(every_s=7.0)
    assert seven.every_s == 7
    assert (seven.next_after(utc(2026, 5, 1)) - utc(1970, 1, 1)).total_seconds() % 7 == 0
    assert seven.period_s(utc(2026, 5, 1)) == 7


# -- DST -------------------------------------------------------------------------------------------


def test_fixed_time_spring_forward_fires_once_at_the_jump():
    paris = Cadence.parse("30 2 * * *", tz="Europe/Paris")  # 2026-03-29 02:00 CET -> 03:00 CEST
    assert slots(paris, utc(2026, 3, 27, 12), 3) == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1),
        utc(2026, 3, 30, 0, 30),
    ]
    assert [
        s.astimezone(PARIS).strftime("%H:%M") for s in slots(paris, utc(2026, 3, 27, 12), 3)
    ] == ["02:30", "03:00", "02:30"]
    ny = Cadence.parse("30 2 * * *", tz="America/New_York")  # 2026-03-08 02:00 EST -> 03:00 EDT
    assert slots(ny, utc(2026, 3, 6, 12), 3) == [
        utc(2026, 3, 7, 7, 30),
        utc(2026, 3, 8, 7),
        utc(2026, 3, 9, 6, 30),
    ]


def test_fixed_time_fall_back_fires_once_at_the_first_occurrence():
    paris = Cadence.parse("30 2 * * *", tz="Europe/Paris")  # 2026-10-25 03:00 CEST -> 02:00 CET
    assert slots(paris, utc(2026, 10, 23, 12), 3) == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]
    ny = Cadence.parse("30 1 * * *", tz="America/New_York")  # 2026-11-01 02:00 EDT -> 01:00 EST
    assert slots(ny, utc(2026, 10, 31, 12), 2) == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]
    # After the first 02:30 (inside the repeated hour, fold=1), the next is the next day's.
    assert paris.next_after(utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 26, 1, 30)


def test_fixed_time_matches_that_land_on_the_same_jump_are_one_slot():
    cadence = Cadence.parse("0 2,3 * * *", tz="Europe/Paris")
    assert slots(cadence, utc(2026, 3, 28, 12), 2) == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0)]
    assert slots_between(
        Cadence.parse("0,30 2 * * *", tz="Europe/Paris"), utc(2026, 3, 28, 22), utc(2026, 3, 29, 22)
    ) == [utc(2026, 3, 29, 1)]


DAYS = [  # (zone, local day of the transition, real hours that day)
    ("Europe/Paris", datetime(2026, 3, 29), 23),
    ("Europe/Paris", datetime(2026, 10, 25), 25),
    ("America/New_York", datetime(2026, 3, 8), 23),
    ("America/New_York", datetime(2026, 11, 1), 25),
]


@pytest.mark.parametrize(("zone", "day", "hours"), DAYS)
def test_hourly_fires_every_real_hour_through_a_transition(zone, day, hours):
    tz = ZoneInfo(zone)
    start = day.replace(tzinfo=tz).astimezone(UTC)
    end = (day + timedelta(days=1)).replace(tzinfo=tz).astimezone(UTC)
    assert (end - start).total_seconds() == hours * 3600
    got = slots_between(
        Cadence.parse("0 * * * *", tz=zone),
        start - timedelta(seconds=1),
        end - timedelta(seconds=1),
    )
    assert got == [start + timedelta(hours=h) for h in range(hours)]


@pytest.mark.parametrize(("zone", "day", "hours"), DAYS)
def test_every_15_minutes_has_no_gap_and_no_duplicate(zone, day, hours):
    tz = ZoneInfo(zone)
    start = day.replace(tzinfo=tz).astimezone(UTC)
    cadence = Cadence.parse("*/15 * * * *", tz=zone)
    got = slots_between(cadence, start, start + timedelta(hours=hours))
    assert got == [start + timedelta(minutes=15 * i) for i in range(1, 4 * hours + 1)]
    # latest_at_or_before agrees, one at a time and all at once.
    assert cadence.latest_at_or_before(got[-1], len(got)) == got
    for previous, slot in itertools.pairwise(got):
        assert cadence.latest_at_or_before(slot) == [slot]
        assert cadence.latest_at_or_before(slot - timedelta(microseconds=1)) == [previous]


def test_inside_the_repeated_hour():
    at = utc(2026, 10, 25, 1, 10)  # Paris 02:10 CET, the second 02:10 of the day
    assert Cadence.parse("*/15 * * * *", tz="Europe/Paris").next_after(at) == utc(
        2026, 10, 25, 1, 15
    )
    assert Cadence.parse("0 * * * *", tz="Europe/Paris").next_after(at) == utc(2026, 10, 25, 2)
    assert Cadence.parse("0 * * * *", tz="Europe/Paris").latest_at_or_before(at, 3) == [
        utc(2026, 10, 24, 23),
        utc(2026, 10, 25, 0),
        utc(2026, 10, 25, 1),
    ]
    assert Cadence.parse("30 2 * * *", tz="Europe/Paris").latest_at_or_before(at) == [
        utc(2026, 10, 25, 0, 30)
    ]


def test_lord_howe_half_hour_jump():
    # Australia/Lord_Howe 2026-10-04 02:00 (+10:30) -> 02:30 (+11): 02:15 fires at the jump, 15:30
    # UTC.
    cadence = Cadence.parse("15 2 * * *", tz="Australia/Lord_Howe")
    assert slots(cadence, utc(2026, 10, 2, 12), 3) == [
        utc(2026, 10, 2, 15, 45),
        utc(2026, 10, 3, 15, 30),
        utc(2026, 10, 4, 15, 15),
    ]


# -- period_s and latest_at_or_before --------------------------------------------------------------


def test_period_s():
    assert Cadence.parse("0 3 * * *", tz="Europe/Paris").period_s(utc(2026, 5, 1, 12)) == 86400
    paris = Cadence.parse("0 3 * * *", tz="Europe/Paris")
    # Fixed time: the DST days are 23 h and 25 h of real time between one 03:00 and the next.
    assert (
        paris.period_s(utc(2026, 3, 28))
        == 82800
        == (utc(2026, 3, 29, 1) - utc(2026, 3, 28, 2)).total_seconds()
    )
    assert (
        paris.period_s(utc(2026, 10, 24))
        == 90000
        == (utc(2026, 10, 25, 2) - utc(2026, 10, 24, 1)).total_seconds()
    )
    assert Cadence.parse("*/5 * * * *").period_s(utc(2026, 5, 1)) == 300


def test_latest_at_or_before_after_a_week_of_minutes():
    cadence = Cadence.parse("* * * * *", tz="Europe/Paris")
    at = datetime(2026, 5, 8, 12, 0, 30, 5, tzinfo=UTC)
    assert cadence.latest_at_or_before(at) == [utc(2026, 5, 8, 12)]
    assert cadence.latest_at_or_before(at, 2) == [utc(2026, 5, 8, 11, 59), utc(2026, 5, 8, 12)]
    assert cadence.latest_at_or_before(utc(2026, 5, 8, 12, 1)) == [utc(2026, 5, 8, 12, 1)]  # <= at
    assert Cadence.parse("0 12 29 2 *").latest_at_or_before(utc(2026, 5, 1), 2) == [
        utc(2020, 2, 29, 12),
        utc(2024, 2, 29, 12),
    ]


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"expression": "61 * * * *"}, "bad cron expression '61 * * * *': Bad minute"),
        ({"expression": "0 25 * * *"}, "Bad hour"),
        ({"expression": "0 0 * * * *"}, "expected 5 fields"),
        ({"expression": "* * *"}, "expected 5 fields"),
        ({"expression": ""}, "expected 5 fields"),
        ({"expression": "@reboot"}, "@reboot"),
        ({"expression": "@fortnightly"}, "unsupported cron macro"),
        ({"expression": "0 0 30 2 *"}, "never fires"),
        ({"expression": "0 0 */30 2 1#5"}, "never fires"),
        ({"expression": "0 0 32 * *"}, "Bad day-of-month"),
        ({"expression": "0 3 * * *", "tz": "Mars/Base"}, "unknown time zone 'Mars/Base'"),
        ({"expression": "0 3 * * *", "tz": "../etc/passwd"}, "unknown time zone"),
        ({"expression": "0 3 * * *", "every_s": 60}, "exactly one"),
        ({}, "exactly one"),
        ({"every_s": 0}, "every_s"),
        ({"every_s": -1}, "every_s"),
        ({"every_s": 1.5}, "every_s"),
        ({"every_s": "x"}, "every_s"),
        ({"every_s": True}, "every_s"),
        ({"every_s": float("nan")}, "every_s"),
    ],
)
def test_bad_input_is_a_schedule_error(kwargs, words):
    with pytest.raises(ScheduleError) as raised:
        Cadence.parse(**kwargs)
    assert words in str(raised.value)
    assert isinstance(raised.value, ValueError)


# -- properties ------------------------------------------------------------------------------------

ZONES = ["Europe/Paris", "America/New_York", "UTC", "Australia/Lord_Howe"]
EXPRESSIONS = [
    "30 2 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "15 1,2,3 * * *",
    "0 9-17 * * 1-5",
    "*/7 2 * * *",
    "0 0 1 * *",
    "45 23 * * 0",
    "0,30 1-3 * * *",
]
TRANSITIONS = [
    utc(2026, 3, 29, 1),
    utc(2026, 10, 25, 1),
    utc(2026, 3, 8, 7),
    utc(2026, 11, 1, 6),
    utc(2026, 4, 4, 15),
    utc(2026, 10, 3, 15, 30),
    utc(2025, 10, 4, 15, 30),
]
moments = st.one_of(
    st.datetimes(datetime(2024, 1, 1), datetime(2028, 12, 31), timezones=st.just(UTC)),
    st.builds(
        lambda t, s: t + timedelta(seconds=s),
        st.sampled_from(TRANSITIONS),
        st.integers(-4 * 3600, 4 * 3600),
    ),
)


@settings(max_examples=300, deadline=None)
@given(at=moments, zone=st.sampled_from(ZONES), expression=st.sampled_from(EXPRESSIONS))
def test_next_and_latest_agree(at, zone, expression):
    cadence = Cadence.parse(expression, tz=zone)
    following = cadence.next_after(at)
    (latest,) = cadence.latest_at_or_before(at)
    assert latest <= at < following
    assert cadence.next_after(latest) == following
    assert cadence.latest_at_or_before(following) == [following]
    assert following.microsecond == following.second == 0 and following.tzinfo is UTC


@settings(max_examples=200, deadline=None)
@given(at=moments, zone=st.sampled_from(ZONES), expression=st.sampled_from(EXPRESSIONS))
def test_slots_strictly_increase(at, zone, expression):
    cadence = Cadence.parse(expression, tz=zone)
    got = slots(cadence, at, 6)
    assert all(a < b for a, b in itertools.pairwise(got))
    assert cadence.latest_at_or_before(got[-1], 6) == got
    assert cadence.period_s(got[0] - timedelta(microseconds=1)) == (got[1] - got[0]).total_seconds()
