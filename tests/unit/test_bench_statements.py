"""bench --statements names pg_stat_statements' texts after our named queries."""

import re

import pytest

from bench.statements import Usage, minus, name_of, per_job
from coordinator.pg.sqlfile import load_all
from dispatcher.constants import COMPLETED_DELETE, COMPLETED_KEEP
from dispatcher.db.completions import completion_statements
from dispatcher.db.queries import query
from dispatcher.db.store import claim_sql, steal_sql


def as_pg_stat_statements_shows_it(text: str) -> str:
    """What pg_stat_statements stores (seen on PostgreSQL 18): parameters and constants, NULL,
    booleans and extract()'s field included, as $1, $2, ... (it keeps comments; we drop them here
    and in name_of)."""
    n = iter(range(1, 10_000))
    # (kept by the server; we drop them)
    lines = [line.split("--")[0] for line in text.splitlines()]
    text = "\n".join(lines)
    text = re.sub(r"%\(\w+\)s", lambda m: f"${next(n)}", text)
    text = re.sub(
        r"'[^']*'|\b(?:NULL|true|false)\b", lambda m: f"${next(n)}", text, flags=re.IGNORECASE
    )
    # a constant too
    text = re.sub(r"(?<=extract\()\w+", lambda m: f"${next(n)}", text, flags=re.IGNORECASE)
    return re.sub(r"(?<![\w$])\d+", lambda m: f"${next(n)}", text)


@pytest.mark.parametrize("package", ["dispatcher.db", "coordinator", "bench"])
def test_every_named_query_is_recognised(package):
    # fragments: below
    texts = {name: text for name, text in load_all(package).items() if "{" not in text}
    wrong = {name: name_of(as_pg_stat_statements_shows_it(text)) for name, text in texts.items()}
    # notify_enqueued and notify_change are the same statement.
    assert {
        n: got
        for n, got in wrong.items()
        if got != n and got not in ("notify_change", "notify_enqueued")
    } == {}


def test_the_claims_variants_are_told_apart():
    assert [
        name_of(as_pg_stat_statements_shows_it(t))
        for t in (
            claim_sql(None),
            claim_sql((1, 2)),
            claim_sql(tuple(range(64))),
            steal_sql(),
            claim_sql((1, 2), window=True),
        )
    ] == [
        "claim (skip_locked)",
        "claim (partitioned)",
        "claim (all buckets)",
        "claim (steal)",
        "claim (window)",
    ]


def test_the_statements_built_from_fragments_are_named_as_the_store_sends_them():
    """Fragments ({promote_next}, {chain_next}) filled in by query(), the keyed completion around
    either completion the store runs (DISPATCHER_COMPLETED_JOBS)."""
    sent = {
        name: query(name)
        for name in ("jobs_fail_owned", "jobs_release_owned", "ordering_promote_scan")
    }
    for completed, completion in (
        (COMPLETED_KEEP, "jobs_complete_owned"),
        (COMPLETED_DELETE, "jobs_complete_owned_delete"),
    ):
        sent[completion] = completion_statements(completed)[False]
        sent[f"{completion}_keyed"] = completion_statements(completed)[True]
    assert {name: name_of(as_pg_stat_statements_shows_it(text)) for name, text in sent.items()} == {
        name: name for name in sent
    }


def test_per_job_figures_are_deltas_over_the_run():
    before = {"claim (partitioned)": Usage(10, 5.0, 100)}
    after = {
        "claim (partitioned)": Usage(30, 25.0, 2100),
        "jobs_complete_owned": Usage(4, 8.0, 2000),
    }
    rows = per_job(minus(after, before), jobs=2000)
    assert [tuple(r.values())[:4] for r in rows] == [
        ("claim (partitioned)", 10.0, 10.0, 1.0),
        ("jobs_complete_owned", 2.0, 4.0, 2.0),
    ]


def test_the_completions_a_worker_sends_under_delete_are_named_by_their_role():
    """DISPATCHER_COMPLETED_JOBS=delete: both completions close uniqueness windows (sql/dedupe.sql);
    the statements recorded keep the names of the completions they are."""
    from dispatcher.constants import COMPLETED_DELETE
    from dispatcher.db.store import JobStore

    # connects on first use only
    store = JobStore("postgresql://unused", "w", completed_jobs=COMPLETED_DELETE)
    sent = {
        "jobs_complete_owned_delete": store._complete_sql[False],
        "jobs_complete_owned_delete_keyed": store._complete_sql[True],
    }
    assert {name: name_of(as_pg_stat_statements_shows_it(text)) for name, text in sent.items()} == {
        name: name for name in sent
    }
