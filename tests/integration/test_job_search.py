"""Search against a real PostgreSQL, through the admin API and `dispatcher jobs`: by payload
content (a JSON object, or key=value pairs where a bare number also matches its text), by error
text (any case, its wildcards literal), by ids, each combined with the other filters; the counts
and the bulk changes honour them; a search walks one window of ids a page and, window after
window, finds every job the whole list would. (The dashboard: tests/web/test_search_page.py; the
forms alone: tests/unit/test_job_search.py.)"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from dispatcher.admin import (
    Filters,
    cancel_jobs,
    list_halted_keys,
    list_jobs,
    match_jobs,
    payload_filter,
    purge_jobs,
    retry_jobs,
    search_jobs,
)
from dispatcher.api.enqueue import enqueue_sync
from tests.helpers import fetchall
from tests.integration.test_admin_cli import jobs
from tests.integration.test_cli_errors import one_line_error

SMTP = "Traceback (most recent call last):\n  ...\nRuntimeError: SMTP timeout after 30 s"


def searchable(dsn: str) -> dict[str, int]:
    """Jobs whose payloads and errors the searches below tell apart: their ids by name."""
    with psycopg.connect(dsn, autocommit=True) as conn:

        def add(payload: Any, status: str = "queued", error: str | None = None, **kw: Any) -> int:
            # status: queued as enqueued, or failed / discarded with `error`
            job_id = enqueue_sync(conn, kw.pop("job_type", "order.ship"), payload, **kw)
            assert job_id is not None
            if status != "queued":
                conn.execute(  # as a worker leaves it; a keyed job that failed halts its key
                    "UPDATE dispatcher_jobs SET status = %s, last_error = %s, attempts = 1, "
                    "failed_at = now(), ordering_halted = ordering_key IS NOT NULL WHERE id = %s",
                    (status, error, job_id),
                )
            return job_id

        return {
            "number": add({"order": 8812, "customer": {"id": 5}}, "failed", SMTP),
            "text": add(
                {"order": "8812", "customer": {"id": "6"}}, "failed", "ValueError: 50% off"
            ),
            "other": add(
                {"order": 8813, "customer": {"id": 5}}, "discarded", "ValueError: 50x off"
            ),
            # an array: no object is contained in it
            "list": add([8812], "failed", "smtp TIMEOUT"),
            "queued": add({"order": 8812, "note": "a b, c"}, queue="mail"),
            "keyed": add({"order": 8812}, "failed", SMTP, ordering_key="k1", job_type="keyed"),
        }


def listed(dsn: str, **filters: Any) -> set[int]:
    return {r.id for r in list_jobs(dsn, Filters(**filters), limit=100)}


def test_a_payload_search_finds_the_jobs_whose_payload_contains_it(dsn):
    ids = searchable(dsn)
    number_or_text = payload_filter("order=8812")
    assert listed(dsn, payload=number_or_text) == {
        ids["number"],
        ids["text"],
        ids["queued"],
        ids["keyed"],
    }
    assert listed(dsn, payload=payload_filter('order="8812"')) == {ids["text"]}
    assert listed(dsn, payload={"order": 8812}) == {ids["number"], ids["queued"], ids["keyed"]}
    assert listed(dsn, payload=payload_filter("customer.id=5")) == {ids["number"], ids["other"]}
    assert listed(dsn, payload=payload_filter("order=8812 customer.id=5")) == {ids["number"]}
    assert listed(dsn, payload=payload_filter('note="a b, c"')) == {ids["queued"]}
    assert listed(dsn, payload=payload_filter('{"customer": {"id": "6"}}')) == {ids["text"]}
    assert listed(dsn, payload={"order": 1}) == set()
    # with the other filters: all must hold
    assert listed(dsn, payload=number_or_text, statuses=("failed",), job_types=("order.ship",)) == {
        ids["number"],
        ids["text"],
    }
    assert listed(dsn, payload=number_or_text, queues=("mail",)) == {ids["queued"]}


def test_an_error_search_is_a_substring_in_any_case_its_wildcards_literal(dsn):
    ids = searchable(dsn)
    assert listed(dsn, error="smtp timeout") == {ids["number"], ids["list"], ids["keyed"]}
    assert listed(dsn, error="50% off") == {ids["text"]}
    assert listed(dsn, error="50_ off") == set()  # _ is no wildcard
    assert listed(dsn, error="%") == {ids["text"]}
    assert listed(dsn, error="50") == {ids["text"], ids["other"]}
    assert listed(dsn, error="timeout", statuses=("failed",), payload={"order": 8812}) == {
        ids["number"],
        ids["keyed"],
    }


def test_ids_combine_with_the_search(dsn):
    ids = searchable(dsn)
    chosen = (ids["number"], ids["text"], ids["queued"])
    assert listed(dsn, ids=chosen) == set(chosen)
    assert listed(dsn, ids=chosen, error="smtp") == {ids["number"]}
    assert listed(dsn, ids=chosen, payload={"order": 8812}, statuses=("queued",)) == {ids["queued"]}


def test_counts_and_bulk_changes_touch_exactly_what_the_search_matches(dsn):
    ids = searchable(dsn)
    search = Filters(payload=payload_filter("order=8812"))
    match = match_jobs(dsn, search, "retry")
    assert match.count == 3 and match.newest_id == ids["keyed"]
    halted = Filters(halted=True, error="smtp")
    assert [k.job_id for k in list_halted_keys(dsn, halted)] == [ids["keyed"]]
    assert list_halted_keys(dsn, Filters(halted=True, payload={"order": 1})) == []
    result = retry_jobs(dsn, search)
    assert sorted(result.changed) == sorted([ids["number"], ids["text"], ids["keyed"]])
    result = cancel_jobs(dsn, Filters(payload=payload_filter('note="a b, c"')))
    assert result.changed == [ids["queued"]]
    result = purge_jobs(dsn, Filters(error="SMTP"))  # the others it matches are queued now
    assert result.changed == [ids["list"]]
    result = purge_jobs(dsn, Filters(payload=payload_filter("customer.id=5")))
    assert result.changed == [ids["other"]]
    assert dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs")) == {
        ids["number"]: "queued",
        ids["text"]: "queued",
        ids["queued"]: "cancelled",
        ids["keyed"]: "queued",
    }


def test_a_search_walks_one_window_of_ids_a_page_and_misses_nothing_across_windows(dsn):
    empty = search_jobs(dsn, Filters(error="x"), window=10)
    assert (empty.jobs, empty.floor, empty.ceiling, empty.older) == ([], 1, 1, False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        made = [enqueue_sync(conn, "t", {"n": i, "hit": i % 7 == 0}, queue="q") for i in range(60)]
    hits = [job_id for i, job_id in enumerate(made) if i % 7 == 0]
    search = Filters(payload={"hit": True})
    assert {r.id for r in list_jobs(dsn, search, limit=100)} == set(hits)
    found, before, windows = [], None, 0
    while True:
        page = search_jobs(
            dsn, Filters(payload={"hit": True}, before_id=before), limit=2, window=10
        )
        windows += 1
        assert all(page.floor <= r.id < page.ceiling for r in page.jobs), page
        assert [r.id for r in page.jobs] == sorted((r.id for r in page.jobs), reverse=True)
        assert page.ceiling - page.floor <= 10
        found += [r.id for r in page.jobs]
        if len(page.jobs) == 2:  # a full page: the next one goes on from its last job
            before = page.jobs[-1].id
        elif page.older:
            before = page.floor
        else:
            break
        assert windows < 40
    assert found == sorted(hits, reverse=True) and page.floor <= min(made)
    # the first window ends above the newest job; another filter narrows the window's rows
    first = search_jobs(dsn, search, limit=50, window=10)
    assert first.ceiling == max(made) + 1 and first.floor == max(made) - 9 and first.older
    assert {r.id for r in first.jobs} == {h for h in hits if h > max(made) - 10}
    narrowed = search_jobs(dsn, Filters(payload={"hit": True}, min_id=max(made) - 2), window=10)
    assert narrowed.floor == max(made) - 2


def test_the_command_line_takes_the_same_search(dsn):
    ids = searchable(dsn)
    out = jobs(dsn, "list", "--payload", "order=8812", "--status", "failed", "--json")
    assert out.returncode == 0, out.stderr
    assert {r["id"] for r in orjson.loads(out.stdout)} == {ids["number"], ids["text"], ids["keyed"]}
    out = jobs(dsn, "list", "--payload", '{"customer": {"id": 5}}', "--error", "50X OFF")
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == [str(ids["other"])]
    counted = jobs(dsn, "retry", "--error", "smtp timeout")
    assert counted.returncode == 1 and counted.stdout.startswith("3 jobs match"), counted.stdout
    done = jobs(dsn, "retry", "--error", "smtp timeout", "--payload", "customer.id=5", "--yes")
    assert done.returncode == 0 and done.stdout.startswith("retried 1 of 1"), done.stdout
    queued = fetchall(dsn, "SELECT id FROM dispatcher_jobs WHERE status = 'queued'")
    assert {i for (i,) in queued} == {ids["number"], ids["queued"]}
    one_line_error(jobs(dsn, "list", "--payload", "order"), 2, "--payload", "key=value")
    one_line_error(jobs(dsn, "list", "--payload", "{bad"), 2, "--payload", "JSON")
    one_line_error(jobs(dsn, "cancel", "--error", "x" * 201), 2, "--error")
