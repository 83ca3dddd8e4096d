"""Which jobs an operator's list or change applies to (`Filters`, the admin's and the dashboard's),
and which statuses each change touches. Checked here, before any statement: a bad filter is an
AdminInputError naming it. Re-exported by dispatcher.admin."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from dispatcher.api.enqueue_checks import TAG_PATTERN, TAG_RE
from dispatcher.constants import NAME_PATTERN, is_valid_name
from dispatcher.db.literals import tag_array
from dispatcher.errors import AdminInputError
from dispatcher.model import (
    FINISHED_STATUSES,
    STATUS_BLOCKED,
    STATUS_DISCARDED,
    STATUS_FAILED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    STATUS_WAITING,
    STATUSES,
)


def check_name(value: Any, option: str) -> str:
    """A queue name or job type as enqueue accepts them (check_names of api/enqueue_checks.py):
    an operator's filter, pause or limit on another name would match no job, and say it did
    something. AdminInputError naming `option` else."""
    if not is_valid_name(value):
        raise AdminInputError(
            f"{value!r} is not a name a job can have (letters, digits, _ . -: {NAME_PATTERN})",
            option,
        )
    return str(value)


# Which statuses each change applies to.
ELIGIBLE = {
    "retry": (STATUS_FAILED, STATUS_DISCARDED),
    "cancel": (STATUS_QUEUED, STATUS_RUNNING, STATUS_WAITING, STATUS_BLOCKED),
    "purge": FINISHED_STATUSES,
}
HALTING = (STATUS_FAILED, STATUS_DISCARDED)  # the statuses of a job that halts its ordering key


@dataclass(frozen=True, slots=True)
class Filters:
    """Which jobs: all of the given conditions (an empty one: any). Ages are seconds since the job
    entered its status (updated_at: enqueued or retried, claimed, finished)."""

    statuses: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    job_types: tuple[str, ...] = ()
    older_than_s: float | None = None
    newer_than_s: float | None = None
    ids: tuple[int, ...] = ()
    # only jobs that halt their ordering key (failed or discarded, ordering_halted)
    halted: bool = False
    # only jobs with a smaller id: the next page of a list, newest first
    before_id: int | None = None
    # The filters as they stood at this instant of the database's clock (a count someone confirmed):
    # ages measured from it, and a job whose row changed after it left alone.
    as_of: datetime | None = None
    # only jobs that carry every one of these tags (given at enqueue)
    tags: tuple[str, ...] = ()
    # only the jobs of this batch, its callback included (the batch's id is the callback's)
    batch_id: int | None = None

    def __post_init__(self) -> None:
        for option in ("queues", "job_types"):
            for name in getattr(self, option):
                check_name(name, option)
        for tag in self.tags:
            if not isinstance(tag, str) or TAG_RE.fullmatch(tag) is None:
                raise AdminInputError(
                    f"{tag!r} is not a tag a job can have (letters, digits, _ . : -: "
                    f"{TAG_PATTERN})",
                    "tags",
                )
        unknown = [s for s in self.statuses if s not in STATUSES]
        if unknown:
            raise AdminInputError(
                f"unknown status {', '.join(map(repr, unknown))} (one of {', '.join(STATUSES)})",
                "statuses",
            )
        for name in ("older_than_s", "newer_than_s"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise AdminInputError(f"must be a number of seconds >= 0, got {value!r}", name)
        bad = [
            i
            for i in (*self.ids, *([] if self.before_id is None else [self.before_id]))
            if isinstance(i, bool) or not isinstance(i, int) or i < 1
        ]
        if bad:
            raise AdminInputError(f"job ids are whole numbers >= 1, got {bad[:5]}", "ids")
        if self.batch_id is not None and (
            isinstance(self.batch_id, bool)
            or not isinstance(self.batch_id, int)
            or self.batch_id < 1
        ):
            raise AdminInputError(
                f"a batch id is a whole number >= 1, got {self.batch_id!r}", "batch_id"
            )
        if self.as_of is not None and (
            not isinstance(self.as_of, datetime) or self.as_of.tzinfo is None
        ):
            raise AdminInputError(
                f"must be a datetime with a time zone, got {self.as_of!r}", "as_of"
            )

    def params(self) -> dict[str, Any]:
        return {
            "statuses": list(self.statuses) or None,
            "queues": list(self.queues) or None,
            "job_types": list(self.job_types) or None,
            "older_than_s": self.older_than_s,
            "newer_than_s": self.newer_than_s,
            "ids": list(self.ids) or None,
            "halted": self.halted,
            "before_id": self.before_id,
            "as_of": self.as_of,
            "tags": tag_array(self.tags or None),
            "batch_id": self.batch_id,
        }

    def for_action(self, action: str) -> Filters:
        """These filters narrowed to the statuses `action` applies to; a status it never applies
        to is an error (naming `statuses`), not a silent no-op. A cancel of halted jobs applies
        to failed and discarded ones: those are the jobs that halt a key."""
        eligible = HALTING if action == "cancel" and self.halted else ELIGIBLE[action]
        wrong = [s for s in self.statuses if s not in eligible]
        if wrong:
            raise AdminInputError(
                f"{action} applies to {', '.join(eligible)} jobs, not {', '.join(wrong)}",
                "statuses",
            )
        return replace(self, statuses=self.statuses or eligible)
