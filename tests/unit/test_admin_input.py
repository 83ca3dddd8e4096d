"""The admin's input rules and the CLI's pure pieces: ages, filters, what each change applies to."""

import math

import pytest

from dispatcher.admin import AdminInputError, Filters
from dispatcher.api.text import parse_duration_s
from dispatcher.cli.jobs import age_text, error_line


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("0", 0.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("7d", 604800.0),
        ("1.5h", 5400.0),
        (" 5M ", 300.0),
        ("5 m", 300.0),
        ("0.25", 0.25),
    ],
)
def test_an_age_is_seconds_or_a_number_with_a_unit(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize(
    "text", ["-5", "-1h", "", "5x", "h", "nan", "inf", "1e3", "5 minutes", "1,5h", "9" * 400]
)
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError):
        parse_duration_s(text)


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"statuses": ("failed", "nope")}, "statuses"),
        ({"statuses": ("FAILED",)}, "statuses"),
        ({"older_than_s": -1}, "older_than_s"),
        ({"older_than_s": math.nan}, "older_than_s"),
        ({"newer_than_s": math.inf}, "newer_than_s"),
        ({"newer_than_s": True}, "newer_than_s"),
        ({"older_than_s": "60"}, "older_than_s"),
        ({"ids": (1, 0)}, "ids"),
        ({"ids": (-3,)}, "ids"),
        ({"ids": ("7",)}, "ids"),
        ({"ids": (True,)}, "ids"),
    ],
)
def test_bad_filters_are_refused_naming_the_field(kwargs, option):
    with pytest.raises(AdminInputError) as info:
        Filters(**kwargs)
    assert info.value.option == option


def test_good_filters_pass_and_absent_ones_are_sent_as_null():
    f = Filters(statuses=("failed",), queues=("mail",), older_than_s=60, ids=(3, 4))
    assert f.params() == {
        "statuses": ["failed"],
        "queues": ["mail"],
        "job_types": None,
        "older_than_s": 60,
        "newer_than_s": None,
        "ids": [3, 4],
        "halted": False,
        "before_id": None,
        "as_of": None,
        "tags": None,
        "batch_id": None,
        "payload": None,
        "error_like": None,
        "min_id": None,
    }
    assert Filters().params() == {**dict.fromkeys(f.params(), None), "halted": False}
    assert Filters(halted=True).params()["halted"] is True


def test_a_change_narrows_to_the_statuses_it_applies_to_and_refuses_others():
    assert Filters().for_action("retry").statuses == ("failed", "discarded")
    assert Filters().for_action("cancel").statuses == ("queued", "running", "waiting", "blocked")
    # The jobs that halt an ordering key are failed or discarded: a cancel of them names those.
    assert Filters(halted=True).for_action("cancel").statuses == ("failed", "discarded")
    assert Filters(halted=True).for_action("retry").statuses == ("failed", "discarded")
    assert Filters().for_action("purge").statuses == (
        "completed",
        "failed",
        "discarded",
        "cancelled",
    )
    assert Filters(statuses=("discarded",)).for_action("retry").statuses == ("discarded",)
    for action, status in (
        ("retry", "running"),
        ("cancel", "completed"),
        ("cancel", "failed"),
        ("purge", "queued"),
        ("purge", "running"),
        ("purge", "waiting"),
    ):
        with pytest.raises(AdminInputError, match=status) as info:
            Filters(statuses=(status,)).for_action(action)
        assert info.value.option == "statuses"


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m"),
        (3599, "59m"),
        (3600, "1h00m"),
        (3 * 3600 + 5 * 60, "3h05m"),
        (2 * 86400 + 4 * 3600, "2d04h"),
        (-3, "0s"),
    ],
)
def test_ages_in_the_list_table(seconds, text):
    assert age_text(seconds) == text


def test_the_list_shows_the_exception_line_of_a_traceback():
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\nValueError: bad input\n'
    )
    assert error_line(traceback) == "ValueError: bad input"
    assert error_line(None) == "" and error_line("") == ""
    assert len(error_line("E" * 500)) == 60


def test_before_id_pages_and_is_checked_like_an_id():
    assert Filters(before_id=10).params()["before_id"] == 10
    for bad in (0, -1, True, 1.5):
        with pytest.raises(AdminInputError):
            Filters(before_id=bad)
