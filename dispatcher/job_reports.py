"""What a running handler may report (`Job.set_progress`, `Job.update_meta`), checked and
serialised here, in the handler's own call: a value that cannot be stored raises ProgressError
there, not later in a background write.

A progress value is any JSON value, at most MAX_PROGRESS_BYTES as JSON; a meta update is a dict
of string keys and JSON values, at most MAX_META_BYTES as JSON together with the updates not
written yet. The stored `meta` is bounded too (STORED_META_BYTES, as PostgreSQL writes it): a merge
past it is dropped, and the worker logs it (dispatcher/runtime/progress.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from dispatcher.errors import ProgressError

MAX_PROGRESS_BYTES: Final = 8 * 1024
MAX_META_BYTES: Final = 8 * 1024
# The job's whole meta, merged over its attempts: twice one update's bound, since PostgreSQL's
# text of a jsonb (what the statement measures) has a space after each ':' and ',' (at most 1.5x).
STORED_META_BYTES: Final = 2 * MAX_META_BYTES


def progress_json(value: Any) -> bytes:
    """`value` as the JSON the progress column stores; ProgressError if not JSON, or too big."""
    data = _dumps(value, "set_progress")
    if len(data) > MAX_PROGRESS_BYTES:
        raise ProgressError(
            f"set_progress: the value is {len(data)} bytes as JSON, over the limit of "
            f"{MAX_PROGRESS_BYTES}: report a figure, not data"
        )
    return data


def merged_meta(pending: dict[str, Any] | None, changes: Mapping[str, Any]) -> dict[str, Any]:
    """`pending` (updates not written yet, or None) with `changes` merged in, as a new dict of
    plain JSON values (what the handler passed is copied: editing it later changes nothing here).
    ProgressError if `changes` is not a dict of string keys and JSON values, or the merge is over
    MAX_META_BYTES as JSON."""
    if not isinstance(changes, Mapping):
        raise ProgressError(
            f"update_meta takes a dict of JSON values, got {type(changes).__name__}"
        )
    bad = [k for k in changes if not isinstance(k, str)]
    if bad:
        raise ProgressError(f"update_meta: keys must be strings, got {bad[0]!r}")
    copied: dict[str, Any] = orjson.loads(_dumps(dict(changes), "update_meta"))
    merged = copied if pending is None else {**pending, **copied}
    size = len(orjson.dumps(merged))
    if size > MAX_META_BYTES:
        raise ProgressError(
            f"update_meta: the metadata is {size} bytes as JSON"
            + ("" if pending is None else " (with the updates not written yet)")
            + f", over the limit of {MAX_META_BYTES}: keep figures and references in it"
        )
    return merged


def _dumps(value: Any, what: str) -> bytes:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ProgressError(f"{what}: the value cannot be written as JSON: {exc}") from None
