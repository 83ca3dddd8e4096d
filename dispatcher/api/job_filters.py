"""Which jobs an operator's list or change applies to (`Filters`, the admin's and the dashboard's),
and which statuses each change touches; the search forms people type (payload_filter: key=value
pairs or a JSON object; id_list). Checked here, before any statement: a bad filter is an
AdminInputError naming it. Re-exported by dispatcher.admin."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import orjson

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
# Searches: what one may hold, so that a statement's parameters stay small.
MAX_PAYLOAD_FORMS = 16  # objects a payload search matches any one of (2 per number-like value)
MAX_PAYLOAD_BYTES = 4096  # of them all, as JSON
MAX_ERROR_CHARS = 200  # of an error text searched for
MAX_ID_LIST = 500  # ids typed in one search (the dashboard's), or ticked in one selection


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
    # only jobs whose payload contains this JSON object (JSON containment, @>), or one of these
    # objects (payload_filter's key=value form: 8812 or "8812")
    payload: dict[str, Any] | tuple[dict[str, Any], ...] | None = None
    # only jobs whose last error contains this text, in any case
    error: str | None = None
    # only jobs with this id or a larger one: the floor of a search's window (search_jobs)
    min_id: int | None = None

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
            for i in (*self.ids, *(i for i in (self.before_id, self.min_id) if i is not None))
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
        self._payload_json()
        if self.error is not None and (
            not isinstance(self.error, str)
            or not 0 < len(self.error) <= MAX_ERROR_CHARS
            or "\x00" in self.error
        ):
            raise AdminInputError(
                f"an error text is 1 to {MAX_ERROR_CHARS} characters, got {self.error!r:.60}",
                "error",
            )

    def _payload_json(self) -> list[str] | None:
        """The payload filter's objects as JSON text (None: no payload filter); AdminInputError
        naming `payload` if it is not an object, or a tuple of them, that jsonb takes."""
        if self.payload is None:
            return None
        forms = self.payload if isinstance(self.payload, tuple) else (self.payload,)
        if not 0 < len(forms) <= MAX_PAYLOAD_FORMS or not all(isinstance(f, dict) for f in forms):
            raise AdminInputError(
                f"a JSON object, or a tuple of 1 to {MAX_PAYLOAD_FORMS} of them, got "
                f"{self.payload!r:.60}",
                "payload",
            )
        try:
            texts = [orjson.dumps(f).decode() for f in forms]
        except TypeError as exc:
            raise AdminInputError(f"not JSON: {exc}", "payload") from None
        if sum(map(len, texts)) > MAX_PAYLOAD_BYTES or any("\\u0000" in t for t in texts):
            raise AdminInputError(
                f"at most {MAX_PAYLOAD_BYTES} bytes of JSON, and no NUL character", "payload"
            )
        return texts

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
            "payload": self._payload_json(),
            # a substring, its LIKE wildcards taken literally (backslash: ILIKE's escape)
            "error_like": None
            if self.error is None
            else "%" + re.sub(r"([\\%_])", r"\\\1", self.error) + "%",
            "min_id": self.min_id,
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


# One key=value pair of a payload search: a dotted key, then a JSON string in double quotes or a
# bare word, up to the next space or comma.
_PAIR = re.compile(r'([^\s=,"]+)=("(?:[^"\\]|\\.)*"|[^\s,"]*)[\s,]*')
PAYLOAD_FORM_HELP = (
    'key=value pairs (customer.id=5 order=8812; a value with spaces in double quotes: "a b") '
    'or a JSON object ({"order": 8812})'
)


def payload_filter(
    text: str, option: str = "payload"
) -> dict[str, Any] | tuple[dict[str, Any], ...]:
    """A payload search as people type it: a JSON object (the jobs whose payload contains it), or
    key=value pairs, all of which must hold. A dotted key nests (customer.id=5: {"customer":
    {"id": 5}}); a bare value that reads as a JSON number, true, false or null matches that value
    or the same text as a string (order=8812: 8812 or "8812"), any other bare value and a quoted
    one match that string. AdminInputError naming `option` if it is neither."""
    text = text.strip()
    if text.startswith("{"):
        try:
            found = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise AdminInputError(f"not a JSON object: {exc}", option) from None
        if not isinstance(found, dict) or not found:
            raise AdminInputError("a JSON object with at least one key", option)
        return found
    pairs: list[tuple[list[str], list[Any]]] = []
    at = 0
    while at < len(text):
        match = _PAIR.match(text, at)
        if match is None:
            raise AdminInputError(
                f"cannot read {text[at : at + 30]!r}: give {PAYLOAD_FORM_HELP}", option
            )
        key, value = match[1], match[2]
        path = key.split(".")
        if not all(path):
            raise AdminInputError(f"{key!r}: a key with an empty part", option)
        pairs.append((path, _forms(value, option)))
        at = match.end()
    if not pairs:
        raise AdminInputError(f"empty: give {PAYLOAD_FORM_HELP}", option)
    if math.prod(len(forms) for _, forms in pairs) > MAX_PAYLOAD_FORMS:
        raise AdminInputError(
            f"at most {MAX_PAYLOAD_FORMS.bit_length() - 1} bare values that read as numbers, "
            'true, false or null (each matches two ways): quote the others ("5") or give JSON',
            option,
        )
    forms = tuple(
        _nest([(path, value) for (path, _), value in zip(pairs, chosen, strict=True)], option)
        for chosen in itertools.product(*(forms for _, forms in pairs))
    )
    return forms[0] if len(forms) == 1 else forms


def _forms(value: str, option: str) -> list[Any]:
    """What a typed value matches: a quoted one, that string; a bare JSON scalar, itself or its
    text; any other bare word, itself."""
    if value.startswith('"'):
        try:
            return [orjson.loads(value)]
        except orjson.JSONDecodeError as exc:
            raise AdminInputError(f"{value!r} is not a JSON string: {exc}", option) from None
    try:
        scalar = orjson.loads(value)
    except orjson.JSONDecodeError:
        return [value]
    return [scalar, value] if isinstance(scalar, (int, float, bool)) or scalar is None else [value]


def _nest(pairs: list[tuple[list[str], Any]], option: str) -> dict[str, Any]:
    """{"a": {"b": 1}} from [(["a", "b"], 1)]; a key given twice, or as a value and as an object,
    is an error."""
    found: dict[str, Any] = {}
    for path, value in pairs:
        into = found
        for part in path[:-1]:
            into = into.setdefault(part, {})
            if not isinstance(into, dict):
                raise AdminInputError(f"{'.'.join(path)!r}: a key given twice", option)
        if path[-1] in into:
            raise AdminInputError(f"{'.'.join(path)!r}: a key given twice", option)
        into[path[-1]] = value
    return found


def id_list(text: str, option: str = "ids") -> tuple[int, ...]:
    """Job ids typed comma- or space-separated, each once, at most MAX_ID_LIST."""
    ids: dict[int, None] = {}
    for word in re.split(r"[\s,]+", text.strip()):
        if not word:
            continue
        if re.fullmatch(r"[0-9]{1,18}", word) is None or int(word) < 1:
            raise AdminInputError(f"job ids are whole numbers >= 1, got {word[:20]!r}", option)
        ids[int(word)] = None
    if len(ids) > MAX_ID_LIST:
        raise AdminInputError(f"at most {MAX_ID_LIST} ids, got {len(ids)}", option)
    return tuple(ids)
