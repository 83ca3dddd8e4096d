"""A handler's return value as the JSON stored with its job (JobHandle.result reads it back).

Bounded by DISPATCHER_MAX_RESULT_BYTES. A value that JSON cannot hold, or a longer one, is not
stored: the job still completed (its work is done, and running it again would do it twice), its
last_error says why its result is missing, and the worker logs a WARNING.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from dispatcher.db.rows import ResultText

log = logging.getLogger(__name__)

_OPTIONS = orjson.OPT_NON_STR_KEYS


def encode_result(job_id: int, value: Any, max_bytes: int) -> ResultText:
    """`value` as JSON text, or None with the reason it was not stored."""
    try:
        data = orjson.dumps(value, option=_OPTIONS)
    except TypeError as exc:
        why = f"result not stored: its handler returned a value JSON cannot hold ({exc})"
    else:
        if len(data) <= max_bytes and b"\\u0000" not in data:
            return ResultText(data.decode(), None)
        why = (
            f"result not stored: {len(data)} bytes of JSON, over DISPATCHER_MAX_RESULT_BYTES "
            f"({max_bytes})"
            if len(data) > max_bytes
            else "result not stored: it holds a NUL character, which PostgreSQL's jsonb cannot"
        )
    log.warning("job %d completed, but %s", job_id, why)
    return ResultText(None, why)
