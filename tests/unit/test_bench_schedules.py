"""The pure part of `python -m bench schedules` (bench/schedules.py): the row made from the
handlers' recording and the database's slot rows."""

from __future__ import annotations

from pathlib import Path

from bench.schedules import read_recording, summarize
from bench.schedules_app import SCHEDULES


def test_a_row_counts_missed_and_doubled_slots_and_the_lateness_of_each_first_start(
    tmp_path: Path,
) -> None:
    slots, runs, job_id = {}, [], 0
    for n in range(SCHEDULES):
        for second in range(100, 110):
            if n == 0 and second == 105:
                continue  # a missed slot
            job_id += 1
            slots[job_id] = (f"tick-{n}", float(second), second - 9.0)
            runs.append((job_id, float(second), second + 0.010))
    runs.append((1, 100.0, 100.5))  # job 1 ran again later: counted twice, its first start counts
    slots[999] = ("tick-0", 120.0, 111.0)  # outside the window: not counted
    (tmp_path / "1.tsv").write_text("".join(f"{i}\t{s:.6f}\t{t:.6f}\n" for i, s, t in runs))
    row = summarize(read_recording(tmp_path), slots, (100.0, 109.0))
    assert (row["slots"], row["jobs"], row["missed"], row["ran_twice"], row["not_run"]) == (
        SCHEDULES * 10,
        SCHEDULES * 10 - 1,
        1,
        1,
        0,
    )
    assert row["late_p50_ms"] == row["late_max_ms"] == 10.0 and row["within_1s"] == 1
    assert row["lead_min_s"] == row["lead_median_s"] == 9.0
    assert len(row["late_ms"]) == SCHEDULES * 10 - 1
