"""How the operator's commands write ages and sets of buckets for people (status, jobs, schedules)."""

from __future__ import annotations

from collections.abc import Iterable


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
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8': what settings.meta.parse_buckets reads; 'none' if empty."""
    ordered, parts = sorted(buckets), []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts) or "none"
