"""`keyed`: a burst with ordering keys, against the same burst without keys, in both modes.

The key mixes (`MIXES`, seeded draws: `key_mix`), the order check from the handlers' own recording
(`order_check`; the worker app is bench/keyed_app.py) and the ratios per row (`add_ratios`). What
each column means and why the order is checked from the handlers and not the table:
docs/guides/benchmarks.md; the results: bench/RESULTS.md, *Ordering keys*.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

from bench.core import Result, postmaster_pid, recording_dir
from bench.keyed_app import NO_KEY, RECORD_DIR_ENV
from bench.runs import measured_run

APP = "bench.keyed_app:registry"
MIXES = ("none", "keys1000", "hot50", "skewed")
SKEWED_KEYS, SKEWED_HOT_KEYS, SKEWED_HOT_SHARE = 1000, 200, 0.8
Run = tuple[int, str | None, int, int]  # job id, ordering key, start ns, end ns


def key_mix(mix: str, jobs: int, seed: int = 24) -> list[str] | None:
    """The ordering key of each of `jobs` jobs, in enqueue order (None for the `none` mix)."""
    rng = random.Random(seed)
    if mix == "none":
        return None
    if mix in ("keys1000", "hot50"):
        n = 1000 if mix == "keys1000" else 50
        return [f"k{rng.randrange(n)}" for _ in range(jobs)]
    if mix == "skewed":
        hot, cold = (
            SKEWED_HOT_SHARE / SKEWED_HOT_KEYS,
            (1 - SKEWED_HOT_SHARE) / (SKEWED_KEYS - SKEWED_HOT_KEYS),
        )
        weights = list(accumulate(hot if k < SKEWED_HOT_KEYS else cold for k in range(SKEWED_KEYS)))
        return [f"k{k}" for k in rng.choices(range(SKEWED_KEYS), cum_weights=weights, k=jobs)]
    raise ValueError(f"unknown key mix {mix!r}: one of {', '.join(MIXES)}")


def order_check(runs: Iterable[Run], jobs: int) -> dict[str, Any]:
    """Whether each key's jobs ran one at a time in id order, from the handlers' recording.
    `order_violations`: consecutive jobs of a key (by id) where the later started before the
    earlier ended; `ran_twice`: ids recorded more than once; `not_run`: jobs never recorded.
    `order_ok` is None where no job had a key (nothing to order)."""
    by_key: dict[str, list[Run]] = defaultdict(list)
    seen: set[int] = set()
    twice = 0
    for run in runs:
        if run[0] in seen:
            twice += 1
        seen.add(run[0])
        if run[1] is not None:
            by_key[run[1]].append(run)
    violations = 0
    for key_runs in by_key.values():
        key_runs.sort()
        violations += sum(1 for earlier, later in pairwise(key_runs) if later[2] < earlier[3])
    not_run = max(0, jobs - len(seen))
    ok = None if not by_key else violations == 0 and twice == 0 and not_run == 0
    return {
        "order_ok": ok,
        "order_violations": violations,
        "ran_twice": twice,
        "not_run": not_run,
        "keys": len(by_key),
        "top_key_jobs": max((len(r) for r in by_key.values()), default=0),
    }


def read_recording(directory: Path) -> Iterator[Run]:
    """Every run the workers wrote to `directory` (one <pid>.tsv each)."""
    for path in sorted(directory.glob("*.tsv")):
        for line in path.read_text().splitlines():
            job_id, key, start, end = line.split("\t")
            yield int(job_id), None if key == NO_KEY else key, int(start), int(end)


def add_ratios(rows: list[dict[str, Any]], column: str = "due_jobs_per_s") -> None:
    """`vs_none` on every keyed row (its mix / the `none` row of its mode and workers) and
    `vs_skip_locked` on every partitioned row (partitioned / skip_locked, same mix and workers)."""
    at = {(r["mix"], r["mode"], r["workers"], r.get("profile")): r for r in rows}
    for row in rows:
        base = at.get(("none", row["mode"], row["workers"], row.get("profile")))
        if row["mix"] != "none" and base and base.get(column) and row.get(column) is not None:
            row["vs_none"] = round(row[column] / base[column], 2)
        other = at.get((row["mix"], "skip_locked", row["workers"], row.get("profile")))
        if (
            row["mode"] == "partitioned"
            and other
            and other.get(column)
            and row.get(column) is not None
        ):
            row["vs_skip_locked"] = round(row[column] / other[column], 2)


def lead_s(jobs: int) -> float:
    """How far ahead the burst is due: the keyed enqueue (COPY into the staging table, then one
    INSERT ... SELECT that places holders and waiters) must commit first, at well under the
    plain COPY's 80k jobs/s (bench/scenarios.py)."""
    return 2.0 + jobs / 20_000


def keyed_suite(
    dsn: str,
    result: Result,
    *,
    jobs: int,
    workers: list[int],
    modes: list[str],
    mixes: Iterable[str] = MIXES,
    profiles: Iterable[str] = ("bench",),
) -> None:
    """For each settings profile (bench/fleet.py: `defaults` is what a user gets), worker count and
    mix, one run per mode (modes back to back, so drift hits both)."""
    postmaster = postmaster_pid(dsn)
    keys = {mix: key_mix(mix, jobs) for mix in mixes}
    for profile in profiles:
        for w in workers:
            for mix, ordering_keys in keys.items():
                for mode in modes:
                    with recording_dir(RECORD_DIR_ENV, "bench-keyed-") as directory:
                        row = measured_run(
                            dsn,
                            mode,
                            w,
                            jobs,
                            postmaster,
                            label=f"keyed {mix} {mode} x{w} {profile}",
                            delay_s=lead_s(jobs),
                            ordering_keys=ordering_keys,
                            app=APP,
                            timeout_s=1800,
                            profile=profile,
                        )
                        check = order_check(read_recording(directory), jobs)
                    row["due_jobs_per_s"] = (
                        round(jobs / row["due_to_done_s"]) if row["due_to_done_s"] else None
                    )
                    if (row["due_after_commit_s"] or 0) < 0:
                        print(
                            f"  (the jobs were due {-row['due_after_commit_s']:g} s before "
                            "their enqueue committed: this row's figures count part of it; "
                            "lead_s() needs a longer lead)",
                            flush=True,
                        )
                    result.add(mix=mix, profile=profile, **row, **check)
    add_ratios(result.rows)
