"""What enqueue accepts: names, options and payloads, all checked before anything is sent.

A bad value raises `EnqueueError` naming its option (`exc.option`: the CLI turns it into its
flag) or `PayloadError`, and nothing is written. Python would otherwise let several through in a
changed form: `max_attempts=1.5` stored as 2, NaN in a payload stored as null, an infinite
`delay_s` scheduling a job that never runs, a queue name with a trailing newline. The bulk paths
run these per job, so the common case costs a few comparisons (payloads: two byte searches).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final, Literal

import orjson

from dispatcher.constants import (
    NAME_PATTERN,
    NUM_BUCKETS,
    PARENT_FAILURE_POLICIES,
    is_valid_name,
)
from dispatcher.errors import EnqueueError, PayloadError

# Largest delay_s or jitter_s. Far beyond any schedule (a delay that long is a unit mistake), and
# far inside what a timestamp can hold: run_at = now + delay stays below Python's year 9999.
MAX_DELAY_S: Final = 100 * 365.25 * 86_400  # 100 years
MIN_PRIORITY, MAX_PRIORITY = -32768, 32767  # the column is a smallint
MAX_ATTEMPTS: Final = 1_000_000
# An ordering key is an index key (two indexes of migration 0008): bounded well inside a btree
# entry (2,704 bytes at most; 500 characters are 2,000 bytes of UTF-8 at worst).
MAX_ORDERING_KEY_CHARS: Final = 500
# A dedupe key is an index key too (the unique index on (queue_name, dedupe_key, bucket)): the
# same bound, so an over-long one is refused here, not by PostgreSQL's btree mid-COPY.
MAX_DEDUPE_KEY_CHARS: Final = MAX_ORDERING_KEY_CHARS
MIN_PAYLOAD_BYTES: Final = 2  # "{}"
# Longest uniqueness window: a year and a day. Its window rows are kept that long after the job
# finished; a longer one is more likely a unit mistake than a schedule.
MAX_DEDUPE_WINDOW_S: Final = 366 * 86_400
# A job's tags: a few short labels to find it by (`jobs list --tag`). No comma or space, so the
# CLI's and the dashboard's comma-separated lists read back the same tags; no quote or brace, so
# an array literal holds them as they are.
MAX_TAGS: Final = 16
TAG_PATTERN: Final = r"[A-Za-z0-9_.:\-]{1,64}"
TAG_RE: Final = re.compile(TAG_PATTERN)


def check_integer(option: str, value: Any, lo: int, hi: int) -> None:
    """An int in lo..hi. Not a float (1.5 would be rounded or truncated on the way to the
    database) and not a bool (True for a count is a bug, not a 1)."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise EnqueueError(f"{option} must be an integer, got {value!r}", option)
    if not lo <= value <= hi:
        raise EnqueueError(f"{option} must be in {lo}..{hi}, got {value}", option)


def check_seconds(option: str, value: Any) -> None:
    """A finite number of seconds in 0..MAX_DELAY_S. NaN fails every comparison, so it fails
    here too, as do the infinities; bools are refused like in check_integer."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= MAX_DELAY_S
    ):
        raise EnqueueError(
            f"{option} must be a number of seconds >= 0 and at most {MAX_DELAY_S:.0f} "
            f"(100 years), got {value!r}",
            option,
        )


def check_max_payload_bytes(value: Any) -> None:
    check_integer("max_payload_bytes", value, MIN_PAYLOAD_BYTES, 2**62)


_checked_names: set[tuple[str, str]] = set()  # (queue, job_type) pairs already validated


def check_names(queue: Any, job_type: Any) -> None:
    if type(queue) is str and type(job_type) is str and (queue, job_type) in _checked_names:
        return  # the hot path of a bulk enqueue: one set lookup (unhashable values never get here)
    if not is_valid_name(job_type):
        raise EnqueueError(f"job_type must match {NAME_PATTERN}, got {job_type!r}", "job_type")
    if not is_valid_name(queue):
        raise EnqueueError(f"queue must match {NAME_PATTERN}, got {queue!r}", "queue")
    if len(_checked_names) < 10_000:
        _checked_names.add((queue, job_type))


def check_options(
    priority: Any, max_attempts: Any, delay_s: Any, jitter_s: Any, run_at: Any
) -> None:
    check_integer("priority", priority, MIN_PRIORITY, MAX_PRIORITY)
    if max_attempts is not None:  # None: not given; the handler's max_attempts applies, else 20
        check_integer("max_attempts", max_attempts, 1, MAX_ATTEMPTS)
    check_seconds("delay_s", delay_s)
    check_seconds("jitter_s", jitter_s)
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise EnqueueError(f"run_at must be a datetime, got {type(run_at).__name__}", "run_at")
        if delay_s:
            raise EnqueueError("give run_at or delay_s, not both", "run_at")
        if run_at.tzinfo is None:
            raise EnqueueError("run_at must be timezone-aware", "run_at")


def check_keys(bucket: Any, partition_key: Any, dedupe_key: Any, ordering_key: Any = None) -> None:
    """bucket, partition_key, dedupe_key and ordering_key: the first two exclude each other; an
    ordering key picks its own bucket (checked against the others by enqueue)."""
    if bucket is not None:
        if partition_key is not None:
            raise EnqueueError("give bucket or partition_key, not both", "bucket")
        check_integer("bucket", bucket, 0, NUM_BUCKETS - 1)
    if partition_key is not None and not isinstance(partition_key, str):
        raise EnqueueError(
            f"partition_key must be a string, got {type(partition_key).__name__}", "partition_key"
        )
    if dedupe_key is not None:
        check_key_text(dedupe_key, "dedupe_key", MAX_DEDUPE_KEY_CHARS)
    if ordering_key is not None:
        check_ordering_key(ordering_key)


def check_dedupe_window(window_s: Any, dedupe_key: Any) -> None:
    """None, or a finite number of seconds in (0, MAX_DEDUPE_WINDOW_S] beside a dedupe_key: a
    window is kept per (queue, dedupe_key)."""
    if window_s is None:
        return
    if (
        isinstance(window_s, bool)
        or not isinstance(window_s, (int, float))
        or not 0 < window_s <= MAX_DEDUPE_WINDOW_S
    ):
        raise EnqueueError(
            f"dedupe_window_s must be a number of seconds > 0 and at most {MAX_DEDUPE_WINDOW_S} "
            f"(366 days), got {window_s!r}",
            "dedupe_window_s",
        )
    if dedupe_key is None:
        raise EnqueueError(
            "dedupe_window_s needs a dedupe_key: a window is kept per (queue, dedupe_key)",
            "dedupe_window_s",
        )


def check_tags(tags: Any) -> tuple[str, ...] | None:
    """None, or the tags as stored: at most MAX_TAGS strings each matching TAG_PATTERN, their
    duplicates dropped, in the order given. A lone string is refused rather than read as its
    characters."""
    if tags is None:
        return None
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise EnqueueError(f"tags must be a list of strings, got {type(tags).__name__}", "tags")
    given = list(tags)
    bad = [t for t in given if not isinstance(t, str) or TAG_RE.fullmatch(t) is None]
    if bad:
        raise EnqueueError(f"each tag must match {TAG_PATTERN}, got {bad[0]!r}", "tags")
    kept = tuple(dict.fromkeys(given))
    if len(kept) > MAX_TAGS:
        raise EnqueueError(f"at most {MAX_TAGS} tags, got {len(kept)}", "tags")
    return kept or None


# What a job does when a parent ends without success (constants.PARENT_FAILURE_POLICIES).
ParentFailure = Literal["cancel", "run", "wait"]
# Parents of one job: an edge row each, all read under lock at enqueue.
MAX_PARENTS: Final = 100_000


def check_depends_on(
    depends_on: Any, on_parent_failure: Any, ordering_key: Any, dedupe_key: Any
) -> tuple[int, ...] | None:
    """The parents' ids, each once, in the order given (None: no dependencies). A job with parents
    takes no ordering or dedupe key: its status is its parents' to decide, and a key's rules (one
    holder, one live job) would have to wait on them too."""
    if on_parent_failure not in PARENT_FAILURE_POLICIES:
        raise EnqueueError(
            f"on_parent_failure must be one of {', '.join(PARENT_FAILURE_POLICIES)}, "
            f"got {on_parent_failure!r}",
            "on_parent_failure",
        )
    if depends_on is None:
        return None
    if isinstance(depends_on, str | bytes) or not isinstance(depends_on, Iterable):
        raise EnqueueError(
            f"depends_on must be a list of job ids, got {type(depends_on).__name__}", "depends_on"
        )
    parents = tuple(dict.fromkeys(depends_on))
    for parent in parents:
        check_integer("depends_on", parent, 1, 2**63 - 1)
    if len(parents) > MAX_PARENTS:
        raise EnqueueError(f"at most {MAX_PARENTS} parents, got {len(parents)}", "depends_on")
    if ordering_key is not None:
        raise EnqueueError("a job with depends_on cannot take an ordering_key", "ordering_key")
    if dedupe_key is not None:
        raise EnqueueError("a job with depends_on cannot take a dedupe_key", "dedupe_key")
    return tuple(int(parent) for parent in parents)  # a JobHandle is an int: sent as one


def check_ordering_key(key: Any, option: str = "ordering_key") -> None:
    check_key_text(key, option, MAX_ORDERING_KEY_CHARS)


def check_key_text(key: Any, option: str, most: int) -> None:
    """A key that is an index key (ordering, dedupe): a non-empty string of at most `most`
    characters, without NUL (a text column cannot hold one). An empty one is refused: it would
    be a key all the same, and every job given "" by mistake would share it."""
    if not isinstance(key, str):
        raise EnqueueError(f"{option} must be a string, got {type(key).__name__}", option)
    if not key:
        got = "an empty string"
    elif "\x00" in key:
        got = "one with a NUL"
    elif len(key) > most:
        got = f"{len(key)} characters"
    else:
        return
    raise EnqueueError(f"{option} must be 1 to {most} characters, without NUL, got {got}", option)


def serialize_payload(payload: Any, max_bytes: int) -> bytes:
    """The payload as JSON bytes; PayloadError if it cannot be stored exactly as given."""
    try:
        data = orjson.dumps({} if payload is None else payload)
    except TypeError as exc:
        raise PayloadError(f"payload cannot be serialised to JSON: {exc}") from None
    if len(data) > max_bytes:
        raise PayloadError(f"payload is {len(data)} bytes, over the limit of {max_bytes} bytes")
    # orjson writes NaN and the infinities as null, and jsonb refuses \u0000: a byte search for
    # each, and a walk of the payload only after a hit (why find(): docs/design/enqueue.md).
    if data.find(b"null") >= 0 and (bad := non_finite_float(payload)) is not None:
        raise PayloadError(
            f"payload holds {bad!r}: JSON has no NaN or Infinity (it would be stored as null)"
        )
    if data.find(b"\\u0000") >= 0 and holds_nul(payload):
        raise PayloadError(
            "payload holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store"
        )
    return data


def _children(item: Any) -> Iterable[Any] | None:
    """What orjson serialises inside `item`, beyond dicts, lists and tuples (their subclasses,
    enums, dataclasses); None for a leaf. orjson has refused cycles and unknown types already."""
    if isinstance(item, dict):
        return [*item.keys(), *item.values()]
    if isinstance(item, (list, tuple)):
        return item
    if isinstance(item, enum.Enum):
        return (item.value,)
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return [getattr(item, f.name) for f in dataclasses.fields(item)]
    return None


_LEAVES = frozenset({str, int, bool, type(None)})


def non_finite_float(value: Any) -> float | None:
    """The first NaN or infinity in `value`, else None. This runs for every payload that holds a
    None, so exact types come first and leaves are judged where they sit, never stacked: the
    common JSON shapes take no isinstance() chain."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        items = (
            item.values() if kind is dict else item if kind is list or kind is tuple else (item,)
        )
        for v in items:
            kind = type(v)
            if kind is float:
                if v - v != 0.0:  # NaN or an infinity (inf - inf is NaN): one float operation
                    return float(v)
            elif kind in _LEAVES:
                continue
            elif kind is dict or kind is list or kind is tuple:
                stack.append(v)
            elif (children := _children(v)) is not None:  # subclasses, enums, dataclasses
                stack.extend(children)
    return None


def holds_nul(value: Any) -> bool:
    """Whether a string in `value` (a dict key too) holds a NUL character."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif (children := _children(item)) is not None:
            stack.extend(children)
    return False
