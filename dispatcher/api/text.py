"""How the operator's commands and the dashboard write ages and sets of buckets for people, and
read the ages people write (status, jobs, schedules, dispatcher web)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")


def parse_duration_s(text: str) -> float:
    """'90' or '90s' -> 90.0, '10m' -> 600.0, '2h', '1.5d'; ValueError for anything else (negative,
    nan, inf, an unknown unit)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(
            f"expected an age >= 0: seconds, or a number with s, m, h or d (90s, 10m, 2h, 7d), "
            f"got {text!r}"
        )
    value = float(match[1]) * _UNITS_S[match[2] or "s"]
    if not math.isfinite(value):
        raise ValueError(f"too large: {text!r}")
    return value


def age_text(seconds: float) -> str:
    """A compact age: 45s, 12m, 3h05m, 2d04h."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def bucket_ranges(buckets: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8': what settings.meta.parse_buckets reads; 'none' if
    empty."""
    ordered, parts = sorted(buckets), []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts) or "none"
