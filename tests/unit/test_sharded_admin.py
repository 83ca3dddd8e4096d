"""An operator's writes on a distributed jobs table, without a cluster: every admin write pins
each read of the jobs table to the statement's bucket and reads no clock of its own, the ages
become instants measured as admin_filters measures them, and ids are grouped by bucket (the
cluster runs them: tests/citus)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.admin import _sql
from dispatcher.db.queries import query
from dispatcher.db.sharded_admin import by_bucket, clock_params, pin_write

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("action", ["retry", "cancel", "purge"])
def test_a_pinned_write_reads_every_job_in_its_bucket_and_no_clock(action):
    single = _sql(f"admin_jobs_{action}")
    text = pin_write(single)
    # Every alias that reads dispatcher_jobs names the bucket.
    for alias in re.findall(r"dispatcher_jobs AS (\w+)", single):
        assert f"{alias}.bucket = %(bucket)s::smallint" in text, alias
    assert "now()" not in text
    # The ages are instants (clock_params): Citus takes no timestamptz - interval in the CASE.
    assert "%(older_than_at)s::timestamptz" in text and "%(older_than_s)s::float8 *" not in text


def test_the_store_cancel_without_filters_pins_too_and_a_text_without_ids_is_refused():
    text = pin_write(query("admin_jobs_cancel").replace("{filters}", "true"))
    assert "j.bucket = %(bucket)s::smallint AND j.id = ANY" in text and "now()" not in text
    with pytest.raises(ValueError, match="pin"):
        pin_write("UPDATE dispatcher_jobs SET status = 'queued'")


@given(
    older=st.none() | st.floats(0, 1e7),
    newer=st.none() | st.floats(0, 1e7),
    as_of=st.none() | st.datetimes(timezones=st.just(UTC)),
)
def test_ages_become_instants_from_as_of_or_else_the_database_clock(older, newer, as_of):
    got = clock_params(NOW, {"older_than_s": older, "newer_than_s": newer, "as_of": as_of})
    base = as_of or NOW
    assert got["now"] == NOW
    assert got["older_than_at"] == (None if older is None else base - timedelta(seconds=older))
    assert got["newer_than_at"] == (None if newer is None else base - timedelta(seconds=newer))


@given(st.dictionaries(st.integers(1, 50), st.integers(0, 63)), st.lists(st.integers(1, 60)))
def test_ids_go_to_their_bucket_once_each_and_unknown_ones_to_bucket_0(found, ids):
    groups = by_bucket(ids, found)
    assert sorted(i for some in groups.values() for i in some) == sorted(ids)
    for bucket, some in groups.items():
        assert all(found.get(i, 0) == bucket for i in some)
        assert some == [i for i in ids if found.get(i, 0) == bucket]  # order kept
