"""`schedules`: how late each slot's job starts, on a ready fleet at the defaults and tuned.

The worker app (bench/schedules_app.py) declares 5 schedules firing every second. For `seconds`
after the fleet is ready, every slot's job runs; then the fleet stops and the handlers' recording
is read against the database's runs. Reported per profile and mode: slots expected, jobs, slots
missed or run twice, and the lateness of each start after its slot (p50, p99, max), the lead with
which the jobs were enqueued ahead. What the columns mean: docs/guides/benchmarks.md.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg

from bench.core import Result, recording_dir, reset
from bench.fleet import Fleet
from bench.scenarios import percentiles
from bench.schedules_app import RECORD_DIR_ENV, SCHEDULES

APP = "bench.schedules_app:registry"
LATE_COLUMNS = ("late_p50_ms", "late_p99_ms", "late_max_ms")


def read_recording(directory: Path) -> list[tuple[int, float, float]]:
    """(job id, slot, start) of every run the workers wrote to `directory`."""
    runs = []
    for path in sorted(directory.glob("*.tsv")):
        for line in path.read_text().splitlines():
            job_id, slot, start = line.split("\t")
            runs.append((int(job_id), float(slot), float(start)))
    return runs


def summarize(
    runs: Iterable[tuple[int, float, float]],
    slots: dict[int, tuple[str, float, float]],
    window: tuple[float, float],
) -> dict[str, Any]:
    """The row of one run. `slots`: job id -> (schedule, slot, enqueued at) from the database;
    only slots within `window` (from the first slot after the fleet was ready to the last one due
    before it stopped) count."""
    lo, hi = window
    expected = {
        (f"tick-{n}", float(s)) for n in range(SCHEDULES) for s in range(int(lo), int(hi) + 1)
    }
    got = {(name, slot) for name, slot, _ in slots.values() if lo <= slot <= hi}
    starts: dict[int, list[float]] = {}
    for job_id, slot, start in runs:
        if job_id in slots and lo <= slots[job_id][1] <= hi:
            starts.setdefault(job_id, []).append(start - slot)
    late_ms = sorted(min(s) * 1000 for s in starts.values())
    leads = [slot - enqueued for _, slot, enqueued in slots.values() if lo <= slot <= hi]
    return {
        "schedules": SCHEDULES,
        "slots": len(expected),
        "jobs": len(got),
        "missed": len(expected - got),
        "not_run": len(got) - len(starts),
        "ran_twice": sum(len(s) > 1 for s in starts.values()),
        **(percentiles("late", late_ms) if late_ms else dict.fromkeys(LATE_COLUMNS)),
        "within_1s": round(sum(ms < 1000 for ms in late_ms) / len(late_ms), 4) if late_ms else None,
        "lead_min_s": round(min(leads), 2) if leads else None,
        "lead_median_s": round(statistics.median(leads), 2) if leads else None,
        "late_ms": [round(ms, 2) for ms in late_ms],
    }


def schedules_suite(
    dsn: str,
    result: Result,
    *,
    workers: int,
    modes: list[str],
    profiles: Iterable[str],
    seconds: float,
) -> None:
    """One run per profile and mode: a ready fleet runs the schedules for `seconds`."""
    for profile in profiles:
        for mode in modes:
            with psycopg.connect(dsn, autocommit=True) as conn:
                _clear(conn)
                with recording_dir(RECORD_DIR_ENV, "bench-schedules-") as directory:
                    with Fleet(dsn, mode, workers, profile=profile, app=APP) as fleet:
                        fleet.wait_ready()
                        ready_at = _db_epoch(conn)
                        time.sleep(seconds)
                        stop_at = _db_epoch(conn)
                        time.sleep(2.0)  # the last due slots' jobs start
                    slots = {
                        r[0]: (r[1], r[2].timestamp(), r[3].timestamp())
                        for r in conn.execute(
                            "SELECT job_id, schedule_name, slot_at, enqueued_at "
                            "FROM dispatcher_schedule_runs WHERE job_id IS NOT NULL"
                        ).fetchall()
                    }
                    # The first slots after start-up are enqueued by the first round: from 2 s on.
                    row = summarize(
                        read_recording(directory),
                        slots,
                        (float(int(ready_at) + 2), float(int(stop_at))),
                    )
                # the jobs enqueued ahead, the schedules: the next scenario starts empty
                _clear(conn)
            late = row.pop("late_ms")
            result.add(profile=profile, mode=mode, workers=workers, seconds=seconds, **row)
            result.rows[-1]["late_ms"] = late  # in the JSON, not on the console


def _clear(conn: psycopg.Connection[Any]) -> None:
    reset(conn)
    conn.execute("DELETE FROM dispatcher_schedule_runs")
    conn.execute("DELETE FROM dispatcher_schedules")


def _db_epoch(conn: psycopg.Connection[Any]) -> float:
    return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])  # type: ignore[index]
