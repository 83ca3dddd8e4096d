"""The pure parts of `python -m bench limits` (bench/limits.py): the rate's windows, the most starts
in any window, the sweep over starts and ends, and the row made from a recording."""

from __future__ import annotations

from pathlib import Path

from bench.limits import (
    NS,
    job_counts,
    max_in_any_window,
    mean_running,
    mean_running_series,
    rate_windows,
    read_recording,
    running_peak,
    running_series,
    summarize,
    window_table,
)


def s(seconds: float) -> int:
    return int(seconds * NS)


def test_windows_count_starts_from_the_first_and_know_which_had_a_backlog() -> None:
    # 12 starts in the first 10 s (a burst of 4 at once, then 8), 10 in the next, 3 in a last short
    # one.
    starts = (
        [s(5)] * 4
        + [s(5 + i) for i in range(8)]
        + [s(15 + i) for i in range(10)]
        + [s(25), s(26), s(27)]
    )
    windows = rate_windows(starts, per_second=1.0, window_s=10)
    assert [
        (w["window"], w["from_s"], w["starts"], w["rate_jobs"], w["ratio"], w["backlog"])
        for w in windows
    ] == [(1, 0, 12, 10, 1.2, True), (2, 10, 10, 10, 1.0, True), (3, 20, 3, 10, 0.3, False)]
    assert rate_windows([], 1.0, 10) == []


def test_a_start_on_a_window_edge_opens_the_next_window() -> None:
    windows = rate_windows([0, s(10)], per_second=1.0, window_s=10)
    assert [(w["starts"], w["backlog"]) for w in windows] == [(1, True), (1, False)]


def test_the_most_starts_in_any_window_wherever_it_begins() -> None:
    # Aligned windows from 0 see 5 and 6; the span [8, 18) holds 7.
    starts = [s(t) for t in (0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 18)]
    assert max_in_any_window(starts, 10) == 7
    assert max_in_any_window([s(0), s(10)], 10) == 1  # half-open: 10 s apart is two windows
    assert max_in_any_window([], 10) == 0


def test_the_sweep_finds_the_most_running_at_once_and_an_end_frees_its_slot_at_once() -> None:
    intervals = [(0, 10), (2, 6), (4, 8), (6, 12), (10, 14)]
    assert running_peak(intervals) == 3  # at 4: (0,10), (2,6), (4,8); at 6 one ends as one starts
    assert running_peak([(0, 5), (5, 10), (10, 15)]) == 1
    assert running_peak([(0, 5), (0, 5)]) == 2
    assert running_peak([]) == 0


def test_the_running_series_keeps_the_most_in_each_bin_including_what_was_open_before_it() -> None:
    intervals = [(s(0.0), s(0.35)), (s(0.05), s(0.08)), (s(0.12), s(0.15)), (s(0.31), s(0.32))]
    assert running_series(intervals, 0, 0.1, 5) == [2, 2, 1, 2, 0]


def test_mean_running_is_busy_time_over_the_span() -> None:
    assert mean_running([(0, 10), (0, 10), (5, 10)]) == 2.5
    assert mean_running([]) == 0.0


def test_a_run_is_summarized_from_its_recording() -> None:
    runs = [("rated", i, s(i * 0.5), s(i * 0.5) + 1) for i in range(50)]  # 2/s for 25 s
    runs += [("capped", 100 + i, s(i * 0.1), s(i * 0.1 + 0.25)) for i in range(100)]  # 2-3 at once
    runs += [("free", 1000 + i, s(1), s(2)) for i in range(10)]
    runs += [("free", 1000, s(3), s(4))]  # a job run twice
    row = summarize(
        runs,
        jobs={"rated": 50, "capped": 100, "free": 11},
        per_second=2.0,
        burst_jobs=2.0,
        max_running=3,
        window_s=10,
    )
    assert [w["starts"] for w in row["windows"]] == [20, 20, 10]
    assert (row["windows_with_backlog"], row["min_window_ratio"], row["max_window_starts"]) == (
        2,
        1.0,
        20,
    )
    assert (
        row["max_starts_any_window"],
        row["window_bound"],
        row["rate_within_bound"],
        row["rate_held"],
    ) == (20, 22.0, True, True)
    assert (row["capped_max_running"], row["cap_held"]) == (3, True)
    assert (row["rated_done_s"], row["capped_done_s"], row["free_done_s"]) == (24.5, 10.15, 4.0)
    assert (row["ran_twice"], row["not_run"]) == (1, 1)  # 160 ids of 161 jobs, one of them twice
    assert row["rated_starts_per_s"][:3] == [2, 2, 2] and len(row["rated_starts_per_s"]) == 25
    assert max(row["capped_running"]) == 3
    assert "window" in window_table(row) and "no (the last jobs)" in window_table(row)


def test_a_limit_overrun_or_a_slow_window_is_flagged() -> None:
    burst = [("rated", i, s(0), s(0)) for i in range(30)] + [
        ("rated", 100 + i, s(i), s(i)) for i in range(1, 25)
    ]
    capped = [("capped", 200 + i, s(1), s(2)) for i in range(4)]
    row = summarize(
        burst + capped,
        jobs={"rated": 54, "capped": 4},
        per_second=2.0,
        burst_jobs=2.0,
        max_running=3,
        window_s=10,
    )
    assert row["rate_within_bound"] is False and row["max_starts_any_window"] == 39
    assert row["cap_held"] is False and row["capped_max_running"] == 4
    slow = [("rated", i, s(i), s(i)) for i in range(25)]  # 1/s against a rate of 2/s
    assert (
        summarize(
            slow, jobs={"rated": 25}, per_second=2.0, burst_jobs=2.0, max_running=3, window_s=10
        )["rate_held"]
        is False
    )


def test_the_backlog_lasts_the_windows_asked_for() -> None:
    jobs = job_counts(
        per_second=50, burst_jobs=50, max_running=5, windows=6, window_s=10, free_jobs=20_000
    )
    assert jobs == {"rated": 3_100, "capped": 3_000, "free": 20_000}
    assert jobs["rated"] - 50 >= 50 * 60  # after the first burst, still a full minute at the rate


def test_the_recording_reads_back_as_written(tmp_path: Path) -> None:
    (tmp_path / "11.tsv").write_text("rated\t1\t100\t200\nfree\t2\t150\t160\n")
    (tmp_path / "12.tsv").write_text("")
    assert list(read_recording(tmp_path)) == [("rated", 1, 100, 200), ("free", 2, 150, 160)]


def test_the_mean_running_series_spreads_each_interval_over_the_bins_it_covers() -> None:
    intervals = [(s(0.0), s(0.15)), (s(0.05), s(0.1)), (s(0.25), s(0.3))]
    assert mean_running_series(intervals, 0, 0.1, 4) == [1.5, 0.5, 0.5, 0.0]
