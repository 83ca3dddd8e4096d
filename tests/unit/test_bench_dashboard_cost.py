"""bench/dashboard_cost.py's pure parts: the job mix, its INSERT statements, p95, the table."""

from __future__ import annotations

import re

import pytest

from bench.dashboard_cost import (
    FINISHED,
    KINDS,
    insert_statements,
    mix,
    p95,
    statement_names,
    table,
)


def test_the_mix_adds_up_and_has_the_issues_shape_at_1m() -> None:
    rows = mix(1_000_000)
    assert sum(n for _, _, n in rows) == 1_000_000
    total = {}
    for kind, _, n in rows:
        total[kind] = total.get(kind, 0) + n
    assert total == {
        "completed": 904_900,
        "queued": 40_000,
        "scheduled": 20_000,
        "running": 2_000,
        "failed": 20_000,
        "halted": 100,
        "discarded": 5_000,
        "cancelled": 5_000,
        "waiting": 3_000,
    }
    recent = {kind: n for kind, is_recent, n in rows if is_recent}
    assert set(recent) == set(FINISHED)
    assert recent["completed"] == 15_081  # a steady ~15,000 completions a minute


@pytest.mark.parametrize("jobs", [1_000, 20_000, 123_457])
def test_the_mix_adds_up_at_any_size(jobs: int) -> None:
    assert sum(n for _, _, n in mix(jobs)) == jobs
    assert all(n > 0 for _, _, n in mix(jobs))


def test_too_few_jobs_for_the_mix_is_an_error() -> None:
    with pytest.raises(ValueError):
        mix(50)


def test_each_kind_gets_one_insert_over_its_own_range_of_the_series() -> None:
    segments = [(kind, 10) for kind in KINDS]
    statements = insert_statements(segments, first=1, ago_s=3600, span_s=3540, keys=7)
    assert len(statements) == len(KINDS)
    ranges = [
        tuple(map(int, re.search(r"generate_series\((\d+)::bigint, (\d+)\)", s).groups()))  # type: ignore[union-attr]
        for s in statements
    ]
    assert ranges == [(10 * i, 10 * i + 9) for i in range(len(KINDS))]
    assert all("{" not in s for s in statements), "a placeholder left unfilled"
    assert "% 7" in statements[list(KINDS).index("waiting")]


def test_ids_are_a_permutation_of_the_range() -> None:
    """id = first + (k * step) % space for k in 0..space-1: every id once (the step is coprime)."""
    statement = insert_statements([("completed", 97)], first=5, ago_s=60, span_s=60, keys=1)[0]
    step = int(re.search(r"\(k \* (\d+)\) % 97", statement)[1])  # type: ignore[index]
    assert sorted(5 + (k * step) % 97 for k in range(97)) == list(range(5, 102))


def test_p95_is_the_nearest_rank() -> None:
    assert p95([float(v) for v in range(1, 21)]) == 19.0
    assert p95([3.0]) == 3.0


def test_admin_statements_are_named_as_admin_sends_them() -> None:
    """With admin_filters filled in for {filters}: the text the refresh recorded matches it."""
    filled = [
        text
        for text, name in statement_names().items()
        if name == "admin_jobs_list" and "{" not in text
    ]
    assert len(filled) == 1 and "j.status = ANY" in filled[0]


def test_the_table_has_a_line_per_statement() -> None:
    rows = [
        {
            "page": "overview",
            "median_ms": 12.5,
            "p95_ms": 20.0,
            "statements": [
                {"statement": "queue_depth", "exec_ms": 10.0, "buffers": 3890},
                {"statement": "status_members", "exec_ms": 0.1, "buffers": 2},
            ],
        },
        {"page": "flow", "median_ms": 1.0, "p95_ms": 2.0, "statements": []},
    ]
    lines = table(rows).splitlines()
    assert len(lines) == 4
    assert lines[1].split() == ["overview", "12.50", "20.00", "queue_depth", "10.00", "3890"]
    assert lines[2].split() == ["status_members", "0.10", "2"]
    assert lines[3].split() == ["flow", "1.00", "2.00", "-", "0.00", "0"]
