"""The demo's report: one table row per mode (the ready-fleet burst, then the cold start), one line
explaining each column, the reading of this run's figures, and when each mode wins.

WHEN_EACH_MODE_WINS is fixed text, kept in agreement with bench/RESULTS.md ("Where partitioned
wins, where it does not, and why"); every number printed above it is computed from this run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dispatcher.constants import NUM_BUCKETS

WHEN_EACH_MODE_WINS = """\
When each mode wins (bench/RESULTS.md in the repository has the full runs and the reasons):
- From a cold start against a queued backlog at the default concurrency 100, partitioned drained
  faster than SKIP LOCKED with 2, 4 and 8 worker processes (medians of 15 rounds 1.03-1.09x). At
  concurrency 500 the two tie (0.99-1.00x): large claims cost both modes the same CPU on 2 cores,
  and a partitioned fleet also runs its coordinator (bench/RESULTS.md, coldstart).
- On 2 cores both modes cost the same CPU per job, so neither pulls far ahead. What grows with the
  workers is SKIP LOCKED's claim: the pages it touches per job doubled from 1 to 16 workers (it
  walks past rows other workers hold), while a partitioned claim's stayed flat. That pays off where
  PostgreSQL has cores to spare.
- With most jobs in a few buckets, SKIP LOCKED is still a little faster: partitioned workers then
  depend on stealing from the owners of the busy buckets.
- The burst measures the queue; the cold start adds process start-up and, in partitioned mode, the
  switch to buckets: a fleet that starts together claims with SKIP LOCKED until its one assignment.
- Single runs vary by 20% or more on a shared machine: compare the modes within one run, and
  repeated runs (`python -m bench`, from the repository) before drawing conclusions."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One drain; seconds on the database clock. Burst: first claim -> last completion, and no
    first_claim_s. Cold start: spawn -> last completion, and spawn -> first claim."""

    jobs: int
    seconds: float
    first_claim_s: float | None
    index_reads_per_job: float
    max_lock_waiters: int

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    burst: Measurement
    cold: Measurement


# (heading, width, cell) per column; the group a column belongs to is in GROUPS.
_COLUMNS = (
    ("mode", 12, lambda r: r.mode),
    ("burst s", 9, lambda r: f"{r.burst.seconds:.3f}"),
    ("jobs/s", 9, lambda r: f"{r.burst.jobs_per_s:,.0f}"),
    ("reads/job", 10, lambda r: f"{r.burst.index_reads_per_job:.2f}"),
    ("waiters", 8, lambda r: str(r.burst.max_lock_waiters)),
    (
        "1st claim s",
        13,
        lambda r: "-" if r.cold.first_claim_s is None else f"{r.cold.first_claim_s:.3f}",
    ),
    ("cold s", 8, lambda r: f"{r.cold.seconds:.3f}"),
    ("jobs/s", 9, lambda r: f"{r.cold.jobs_per_s:,.0f}"),
    ("reads/job", 10, lambda r: f"{r.cold.index_reads_per_job:.2f}"),
    ("waiters", 8, lambda r: str(r.cold.max_lock_waiters)),
)
GROUPS = (("", 1), ("burst from a ready fleet", 4), ("cold start", 5))  # (label, columns spanned)
GAP = "  "  # between the two groups


def column_notes(jobs: int, workers: int) -> list[tuple[str, str]]:
    """(column, what it means): printed one line each under the table."""
    return [
        (
            "burst s",
            f"first claim to last completion of {jobs} jobs committed at once, the {workers} "
            "workers already running and ready",
        ),
        (
            "ready",
            f"each worker's /readyz answered 200 and, in partitioned mode, all {NUM_BUCKETS} "
            "buckets were owned",
        ),
        (
            "1st claim s",
            f"cold start: from spawning the {workers} workers ({jobs} jobs already queued) "
            "to the first claim",
        ),
        (
            "cold s",
            "cold start: from spawning the workers to the last completion (start-up and assignment "
            "count)",
        ),
        ("jobs/s", f"{jobs} / burst s, and {jobs} / cold s"),
        (
            "reads/job",
            "claim-index entries read per job (pg_stat_user_indexes): contention, without machine "
            "noise",
        ),
        ("waiters", "most database sessions seen waiting on a lock at once, sampled every 0.25 s"),
        ("times", "all on the database clock"),
    ]


def _table(results: list[ModeResult]) -> list[str]:
    groups, index = [], 0
    for label, span in GROUPS:
        width = sum(w for _, w, _ in _COLUMNS[index : index + span])
        groups.append(f" {label} ".center(width - 1, "-").rjust(width) if label else " " * width)
        index += span
    lines = [GAP.join(groups).rstrip()]
    split = GROUPS[0][1] + GROUPS[1][1]  # the gap goes between the burst and the cold-start columns

    def row(cells: list[str]) -> str:
        widths = [w for _, w, _ in _COLUMNS]
        parts = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=False))
        ]
        return "".join(parts[:split]) + GAP + "".join(parts[split:])

    lines.append(row([heading for heading, _, _ in _COLUMNS]))
    lines += [row([cell(r) for _, _, cell in _COLUMNS]) for r in results]
    return lines


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def reading(results: list[ModeResult], workers: int, cores: int | None) -> str:
    """This run's figures, mode against mode (the first mode over the second)."""
    if len(results) != 2:
        return ""
    a, b = results
    first_claims = ""
    if a.cold.first_claim_s is not None and b.cold.first_claim_s is not None:
        first_claims = (
            f"; first claim {a.cold.first_claim_s:.2f} s vs {b.cold.first_claim_s:.2f} "
            "s after the spawn"
        )
    return (
        f"This run ({workers} worker process{'es' if workers != 1 else ''} per mode, "
        f"{cores or 'an unknown number of'} cores), {a.mode} / {b.mode} jobs/s:\n"
        f"  {_ratio(a.burst.jobs_per_s, b.burst.jobs_per_s)} on the ready-fleet burst, "
        f"{_ratio(a.cold.jobs_per_s, b.cold.jobs_per_s)} on the cold start{first_claims}.\n"
        f"  Index reads per job on the burst: {a.burst.index_reads_per_job:.2f} {a.mode}, "
        f"{b.burst.index_reads_per_job:.2f} {b.mode}."
    )


def render(results: list[ModeResult], *, jobs: int, workers: int, cores: int | None = None) -> str:
    notes = column_notes(jobs, workers)
    name_width = max(len(name) for name, _ in notes) + 2
    lines = _table(results)
    lines.append("")
    lines += [f"{name:<{name_width}}{text}" for name, text in notes]
    lines.append("")
    lines.append(reading(results, workers, cores if cores is not None else os.cpu_count()))
    lines.append("")
    lines.append(WHEN_EACH_MODE_WINS)
    return "\n".join(lines)
