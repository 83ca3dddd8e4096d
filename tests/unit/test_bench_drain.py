"""`bench drain`'s kinds and ratios: the runtime against our statements as plain SQL (the ceiling)
and against the minimal table (bench/minimal.py, bench/sql/minimal.sql), the physical limit."""

from __future__ import annotations

from bench import minimal
from bench.drain import add_ratios


def rows() -> list[dict]:
    """A drain's rows at 4 workers, both modes, as drain_suite adds them (medians)."""
    return [
        {"kind": "runtime", "mode": "partitioned", "workers": 4, "jobs_per_s": 45_000},
        {"kind": "plain_sql", "mode": "partitioned", "workers": 4, "jobs_per_s": 50_000},
        {"kind": "runtime", "mode": "skip_locked", "workers": 4, "jobs_per_s": 40_000},
        {"kind": "plain_sql", "mode": "skip_locked", "workers": 4, "jobs_per_s": 48_000},
        {"kind": "minimal", "mode": minimal.MODE, "workers": 4, "jobs_per_s": 60_000},
        {"kind": "minimal_delete", "mode": minimal.MODE, "workers": 4, "jobs_per_s": 80_000},
        {"kind": "runtime", "mode": "partitioned", "workers": 1, "jobs_per_s": 30_000},
    ]


def test_runtime_and_plain_sql_rows_state_their_ratio_to_both_minimal_kinds() -> None:
    got = rows()
    add_ratios(got)
    ratios = [{k: v for k, v in r.items() if k.startswith("ratio_")} for r in got]
    assert ratios == [
        {"ratio_to_ceiling": 0.9, "ratio_to_minimal": 0.75, "ratio_to_minimal_delete": 0.56},
        {"ratio_to_minimal": 0.83, "ratio_to_minimal_delete": 0.62},
        {"ratio_to_ceiling": 0.83, "ratio_to_minimal": 0.67, "ratio_to_minimal_delete": 0.5},
        {"ratio_to_minimal": 0.8, "ratio_to_minimal_delete": 0.6},
        {},
        {"ratio_to_minimal": 1.33},  # the completion that deletes, against the one that updates
        {},  # no ceiling or minimal row at 1 worker (drain_suite with ceiling / minimal_table off)
    ]


def test_deleting_runtime_rows_against_the_deleting_ceiling_and_both_minimal_kinds() -> None:
    got = [
        *rows(),
        {"kind": "runtime_delete", "mode": "partitioned", "workers": 4, "jobs_per_s": 72_000},
        {"kind": "plain_sql_delete", "mode": "partitioned", "workers": 4, "jobs_per_s": 75_000},
    ]
    add_ratios(got)
    deleting = [{k: v for k, v in r.items() if k.startswith("ratio_")} for r in got[-2:]]
    assert deleting == [
        {"ratio_to_ceiling": 0.96, "ratio_to_minimal": 1.2, "ratio_to_minimal_delete": 0.9},
        {"ratio_to_minimal": 1.25, "ratio_to_minimal_delete": 0.94},
    ]
    assert got[0]["ratio_to_ceiling"] == 0.9, (
        "a keeping runtime row still goes with the keeping ceiling"
    )


def test_the_minimal_table_has_three_columns_and_one_partial_index() -> None:
    create = minimal.minimal_query("minimal_create")
    assert [line.split()[0] for line in create.splitlines()[1:-1]] == ["id", "status", "payload"]
    index = minimal.minimal_query("minimal_index")
    assert "(id) WHERE status = 'queued'" in index


def test_the_minimal_claim_and_completions_have_the_ceilings_shape() -> None:
    claim = " ".join(minimal.minimal_query("minimal_claim").split())
    assert "ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED" in claim
    assert claim.startswith("UPDATE bench_minimal_jobs SET status = 'running'") and claim.endswith(
        "RETURNING id, payload"
    )
    assert minimal.minimal_query(minimal.KINDS["minimal"]).startswith(
        "UPDATE bench_minimal_jobs SET status = 'done'"
    )
    assert minimal.minimal_query(minimal.KINDS["minimal_delete"]).startswith(
        "DELETE FROM bench_minimal_jobs"
    )
    assert minimal.BATCH == 500
