"""An operator's writes (retry, cancel, purge: sql/admin.sql) on a jobs table distributed by
bucket (Citus): the single-node statements, sent once per bucket of a batch and pinned to it, so
each is a router query on one node, with the database's clock passed in as a parameter: Citus
refuses a function that is not immutable inside a CASE of a write, and the statements keep their
conditions in one (admin.sql says why). What each bucket's change released is promoted in that
bucket (sharded_promote_keys). The loops are in admin.py and JobStore.jobs_cancel; why:
docs/concepts/citus.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

# (what the single-node text says, what the pinned one says). Every text has the first, and one
# of the second's forms (the report's read of the rows: the purge's reads the archive too); the
# others are in some (the dedupe checks of a retry, the filters' ages), and all of each is pinned.
_PINS: Final = (
    (
        (
            "WHERE j.id = ANY(%(ids)s::bigint[])",
            "WHERE j.bucket = %(bucket)s::smallint AND j.id = ANY(%(ids)s::bigint[])",
        ),
    ),
    (
        (
            "LEFT JOIN dispatcher_jobs AS j ON j.id = t.id",
            "LEFT JOIN dispatcher_jobs AS j ON j.bucket = %(bucket)s::smallint AND j.id = t.id",
        ),
        (
            "WHERE h.id = ANY(%(ids)s::bigint[])",
            "WHERE h.bucket = %(bucket)s::smallint AND h.id = ANY(%(ids)s::bigint[])",
        ),
    ),
)
_OPTIONAL_PINS: Final = (
    (
        "WHERE d.queue_name = j.queue_name",
        "WHERE d.bucket = %(bucket)s::smallint AND d.queue_name = j.queue_name",
    ),
    ("WHERE b.id = ANY(", "WHERE b.bucket = %(bucket)s::smallint AND b.id = ANY("),
    # The ages, as instants computed from the clock (clock_params): timestamptz - interval is
    # not immutable either.
    (
        "coalesce(%(as_of)s::timestamptz, now()) - %(older_than_s)s::float8 * interval '1 second'",
        "%(older_than_at)s::timestamptz",
    ),
    (
        "coalesce(%(as_of)s::timestamptz, now()) - %(newer_than_s)s::float8 * interval '1 second'",
        "%(newer_than_at)s::timestamptz",
    ),
    ("now()", "%(now)s::timestamptz"),
)


def pin_write(text: str) -> str:
    """An admin write (admin_jobs_retry, _cancel, _purge, its {filters} filled in) limited to one
    bucket (%(bucket)s), reading the clock from %(now)s and the ages from clock_params'."""
    for forms in _PINS:
        if not any(single in text for single, _ in forms):
            raise ValueError(f"an admin write to pin must read its rows by `{forms[0][0]}`")
        for single, pinned in forms:
            text = text.replace(single, pinned)
    for single, pinned in _OPTIONAL_PINS:
        text = text.replace(single, pinned)
    return text


def clock_params(now: datetime, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters a pinned write reads instead of the clock: `now` (the database's, read by
    db_now) and the filters' ages (older_than_s, newer_than_s) as instants, measured from
    the filters' as_of if they have one, as admin_filters measures them."""
    base: datetime = params.get("as_of") or now

    def since(age_s: float | None) -> datetime | None:
        return None if age_s is None else base - timedelta(seconds=age_s)

    return {
        "now": now,
        "older_than_at": since(params.get("older_than_s")),
        "newer_than_at": since(params.get("newer_than_s")),
    }


def by_bucket(ids: Sequence[int], found: Mapping[int, int]) -> dict[int, list[int]]:
    """`ids` grouped by their bucket (`found`: sharded_buckets_of's rows), in the given order. An
    id not found goes with bucket 0, where the pinned write reports it as no such job."""
    groups: dict[int, list[int]] = {}
    for job_id in ids:
        groups.setdefault(int(found.get(job_id, 0)), []).append(job_id)
    return groups
