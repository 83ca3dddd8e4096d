"""The memory store's copy of the stealing claim's choice (claim_select_steal in sql/claim.sql):
which due jobs a thief takes from other workers' buckets, as the real store's statement does."""

from __future__ import annotations

from dispatcher.db.rows import JobState, Steal


def stealable(due: list[JobState], steal: Steal) -> list[JobState]:
    """claim_select_steal's choice: per bucket in the steal's order, its due jobs from the
    tail, all but the first `reserve` of them in claim order."""
    out: list[JobState] = []
    for bucket in dict.fromkeys(steal.buckets):
        rows = sorted(
            (r for r in due if r.bucket == bucket), key=lambda r: (r.priority, r.run_at, r.id)
        )
        out.extend(reversed(rows[steal.reserve :]))
    return out
