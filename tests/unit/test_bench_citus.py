"""The pure parts of `python -m bench citus` and `citus_faults` (bench/citus.py,
bench/citus_faults.py): the handlers' record read back, the checks of a faults drain, and the
cluster's ratios to the one node."""

from __future__ import annotations

from pathlib import Path

from bench.citus import add_ratios
from bench.citus_faults import Run, check_runs, read_runs

KILLED = 100


def test_the_record_pairs_start_and_end_lines_and_keeps_cut_runs(tmp_path: Path) -> None:
    (tmp_path / "100.log").write_text("1 1 10.0 -\n1 1 10.0 10.5\n2 1 11.0 -\n3 1 12.0 1")
    (tmp_path / "200.log").write_text("2 2 20.0 -\n2 2 20.0 20.1\n")
    runs = read_runs(tmp_path)
    # 3's lines are partial (a write the kill cut short): left out
    assert sorted(runs) == [1, 2]
    assert runs[1] == [Run(1, KILLED, 10.0, 10.5)]
    assert sorted(runs[2], key=lambda r: r.start) == [
        Run(2, KILLED, 11.0, None),
        Run(2, 200, 20.0, 20.1),
    ]


def test_a_killed_workers_runs_may_be_cut_and_run_again() -> None:
    runs = {
        1: [Run(1, KILLED, 1.0, 2.0), Run(1, 200, 8.0, 8.1)],  # finished, completion lost: again
        2: [Run(2, KILLED, 4.0, None), Run(2, 200, 9.0, 9.1)],  # cut by the kill at 5.0
        3: [Run(3, 200, 3.0, 3.1)],
    }
    assert check_runs(runs, {1, 2, 3}, KILLED, killed_at=5.0) == {
        "never_ran": 0,
        "cut_by_kill": 1,
        "cut_by_live": 0,
        "overlapping": 0,
        "completed_twice": 0,
        "ran_again": 2,
    }


def test_a_lost_job_a_double_completion_an_overlap_and_a_live_cut_are_counted() -> None:
    runs = {
        1: [Run(1, 200, 1.0, 2.0), Run(1, 300, 3.0, 4.0)],  # two live workers finished it
        2: [Run(2, KILLED, 4.0, None), Run(2, 200, 4.5, 4.6)],  # ran again before the kill
        3: [Run(3, 300, 6.0, None)],  # a live worker's run never ended
    }
    check = check_runs(runs, {1, 2, 3, 4}, KILLED, killed_at=5.0)
    assert check["never_ran"] == 2  # 3 never ended, 4 never started
    assert check["completed_twice"] == 1
    assert check["overlapping"] == 1
    assert check["cut_by_live"] == 1


def test_the_cluster_rows_get_their_ratios_to_the_one_node_of_their_mode() -> None:
    rows = [
        {"target": "one_node", "mode": "partitioned", "workers": 2, "jobs_per_s": 10_000,
         "pg_cpu_s_per_1k_jobs": 0.1},
        {"target": "citus", "mode": "partitioned", "workers": 2, "jobs_per_s": 2_500,
         "pg_cpu_s_per_1k_jobs": 0.5},
        {"target": "citus", "mode": "skip_locked", "workers": 2, "jobs_per_s": 2_000,
         "pg_cpu_s_per_1k_jobs": 0.6},
    ]  # fmt: skip
    add_ratios(rows)
    assert (rows[1]["vs_one_node"], rows[1]["pg_cpu_vs_one_node"]) == (0.25, 5.0)
    assert "vs_one_node" not in rows[0] and "vs_one_node" not in rows[2]  # no skip_locked node row
