"""Search and per-row selection on the dashboard over plain HTTP, against a real PostgreSQL: the
jobs page searches by payload (key=value or JSON), error text and ids, combined with the other
filters and kept, escaped, in its form and links; a search examines one window of ids a page and
links to the next window, saying which ids it searched; a bad search is a 400 naming its field.
The rows ticked on the page are retried, cancelled or purged exactly, each re-checked on its row
and reported; such a POST needs its CSRF token, and at most MAX_ID_LIST ids."""

from __future__ import annotations

import html
import re
from typing import Any

import psycopg
import pytest

import dispatcher.web.views as views
from dispatcher.api.enqueue import enqueue_sync
from dispatcher.api.job_filters import MAX_ID_LIST
from tests.helpers import fetchall
from tests.web.support import HOSTILE, SEEDED, Client, seed, served


@pytest.fixture
def searchable(dsn):
    """The seeded jobs (every status), and three of an order's jobs among them."""
    seeded = seed(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = {
            "number": enqueue_sync(conn, "ship", {"order": 8812, "customer": {"id": 5}}),
            "text": enqueue_sync(conn, "ship", {"order": "8812"}, queue=SEEDED),
            "other": enqueue_sync(conn, "ship", {"order": 8813, "customer": {"id": 5}}),
        }
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'failed', attempts = 1, failed_at = now(), "
            "last_error = 'KeyError: warehouse 50%% full' WHERE id = %s",
            (ids["number"],),
        )
    return dsn, seeded, ids


def listed(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job-id="(\d+)"', page)]


def everything(dsn: str) -> dict[int, str]:
    return dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs"))


def test_the_jobs_page_searches_by_payload_error_and_ids_with_the_other_filters(searchable):
    dsn, seeded, ids = searchable
    with served(dsn) as web:
        client = Client(web.url)
        status, _, page = client.request("/jobs?payload=order%3D8812")
        assert status == 200 and set(listed(page)) == {ids["number"], ids["text"]}
        assert 'name="payload" id="search-payload" value="order=8812"' in page, "kept in the form"
        assert re.search(r'id="searched">Searched ids 1 to [\d,]+: 2 matches\.', page), page[-900:]
        json_form = "/jobs?payload=" + "%7B%22order%22%3A+8812%7D"  # {"order": 8812}
        assert listed(client.request(json_form)[2]) == [ids["number"]]
        both = "/jobs?payload=customer.id%3D5+order%3D8812"
        assert listed(client.request(both)[2]) == [ids["number"]]
        with_queue = f"/jobs?payload=order%3D8812&queue={SEEDED}"
        assert listed(client.request(with_queue)[2]) == [ids["text"]]
        assert listed(client.request("/jobs?error=WAREHOUSE+50%25")[2]) == [ids["number"]]
        assert listed(client.request("/jobs?error=50_")[2]) == []
        failed = seeded.ids["failed"]
        typed = "%2C+".join(map(str, [*failed, ids["other"]]))
        assert set(listed(client.request(f"/jobs?ids={typed}")[2])) == {*failed, ids["other"]}
        assert listed(client.request(f"/jobs?ids={typed}&payload=customer.id%3D5")[2]) == [
            ids["other"]
        ]
        # A search typed with markup comes back as text, in the form and in the links.
        status, _, page = client.request("/jobs?error=" + "%3Cscript%3Ex%3C%2Fscript%3E")
        assert status == 200 and "<script>x" not in page
        assert 'value="&lt;script&gt;x&lt;/script&gt;"' in page
        hostile = f"/jobs?error={HOSTILE[:40]}".replace(" ", "+").replace("\n", "")
        assert "<script>window" not in client.request(hostile.replace("<", "%3C"))[2]


BAD_SEARCHES = {  # path: the field its error page names
    "/jobs?payload=order": "payload",
    "/jobs?payload=%7Bbad": "payload",
    "/jobs?payload=a%3D1+a%3D2": "payload",
    "/jobs?error=" + "x" * 201: "error",
    "/jobs?ids=1+two": "ids",
    "/jobs?ids=" + "+".join(map(str, range(1, MAX_ID_LIST + 2))): "ids",
}


def test_a_bad_search_is_a_400_naming_its_field(searchable):
    dsn, _, _ = searchable
    with served(dsn) as web:
        answers = {path: Client(web.url).request(path) for path in BAD_SEARCHES}
    named = {
        path: f"({field})" in html.unescape(answers[path][2])
        for path, field in BAD_SEARCHES.items()
    }
    assert {path: answer[0] for path, answer in answers.items()} == dict.fromkeys(BAD_SEARCHES, 400)
    assert all(named.values()), named


def test_a_search_examines_one_window_of_ids_a_page_and_links_to_the_next(searchable, monkeypatch):
    dsn, _, _ = searchable
    with psycopg.connect(dsn, autocommit=True) as conn:
        made = [enqueue_sync(conn, "t", {"hit": i % 4 == 0}, queue="q") for i in range(24)]
    hits = [job_id for i, job_id in enumerate(made) if i % 4 == 0]
    newest = max(everything(dsn))
    monkeypatch.setattr(views, "SEARCH_WINDOW_IDS", 10)
    with served(dsn) as web:
        client = Client(web.url)
        path: str | None = "/jobs?queue=q&payload=hit%3Dtrue"
        found, ranges = [], []
        while path is not None:
            status, _, page = client.request(path)
            assert status == 200, page[-500:]
            searched = re.search(r"Searched ids ([\d,]+) to ([\d,]+)", page)
            assert searched, page[-800:]
            low, high = (int(g.replace(",", "")) for g in searched.groups())
            ranges.append((low, high))
            rows = listed(page)
            assert all(low <= r <= high for r in rows) and rows == sorted(rows, reverse=True)
            found += rows
            older = re.search(r'<a href="([^"]+)" id="search-older">', page)
            path = html.unescape(older[1]) if older else None
            if path is not None:  # the link keeps the search and goes on below the window
                assert "queue=q" in path and "payload=hit%3Dtrue" in path
                assert path.endswith(f"before={low}")
            assert len(ranges) < 20
    assert found == sorted(hits, reverse=True)
    assert ranges[0] == (newest - 9, newest) and all(h - lo == 9 for lo, h in ranges[:-1])
    assert ranges[-1][0] == 1 and "search-older" not in page


def tick(client: Client, action: str, ids: list[int], **form: str) -> tuple[int, str]:
    token = client.csrf("/jobs")
    fields: Any = [("csrf_token", token), *[("id", str(i)) for i in ids], *form.items()]
    status, _, body = client.request(f"/actions/{action}/selected", fields)
    return status, body


def outcomes(page: str) -> dict[int, str]:
    return {
        int(i): o for i, o in re.findall(r'<tr data-job-id="(\d+)" data-outcome="([a-z]+)">', page)
    }


def test_the_ticked_rows_are_changed_exactly_and_each_is_reported(searchable):
    dsn, seeded, ids = searchable
    failed, queued = seeded.ids["failed"], seeded.ids["queued"][0]
    before = everything(dsn)
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        page = client.request("/jobs?payload=order%3D8812")[2]
        assert f'name="id" value="{ids["number"]}" form="selected"' in page
        form = page[page.index('<form method="post" action="/actions/retry/selected"') :]
        form = form[: form.index("</form>")]
        assert 'name="csrf_token"' in form and 'name="payload" value="order=8812"' in form
        for action in ("retry", "cancel", "purge"):
            assert f'formaction="/actions/{action}/selected"' in form
        chosen = [failed[0], failed[1], queued]
        status, body = tick(client, "retry", chosen, payload="order=8812")
        assert status == 200, body[-600:]
        assert outcomes(body) == {failed[0]: "changed", failed[1]: "changed", queued: "skipped"}
        assert "3 matched; 2 changed, 1 skipped." in body
        assert re.search(rf"{queued}</a></td><td>skipped: it is queued: retry applies to", body)
        assert 'href="/jobs?payload=order%3D8812"' in body, "back to the search"
        after = everything(dsn)
        assert {i: s for i, s in after.items() if after[i] != before[i]} == {
            failed[0]: "queued",
            failed[1]: "queued",
        }
        status, body = tick(client, "cancel", [queued, ids["number"]])
        assert outcomes(body) == {queued: "changed", ids["number"]: "skipped"}
        status, body = tick(client, "purge", [queued, seeded.ids["completed"][0]])
        assert outcomes(body) == {queued: "changed", seeded.ids["completed"][0]: "changed"}
        assert queued not in everything(dsn)


def test_a_selection_needs_its_csrf_token_actions_and_at_most_the_cap(searchable):
    dsn, seeded, _ = searchable
    target = seeded.ids["failed"][0]
    before = everything(dsn)
    with served(dsn) as web:  # read-only: no boxes, and the route refuses
        client = Client(web.url)
        page = client.request("/jobs")[2]
        assert 'form="selected"' not in page and "/selected" not in page
        status, body = tick(client, "retry", [target])
        assert status == 403 and "read-only" in body
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        client.csrf("/jobs")
        for fields in ([("id", str(target))], [("csrf_token", "0" * 64), ("id", str(target))]):
            status, _, body = client.request("/actions/retry/selected", fields)  # type: ignore[arg-type]
            assert status == 403 and "CSRF" in body
        many = list(range(1, MAX_ID_LIST + 2))
        status, body = tick(client, "retry", many)
        assert status == 400 and f"at most {MAX_ID_LIST} jobs at once" in body
        status, body = tick(client, "retry", [])
        assert status == 400 and "tick the jobs to retry first" in body
        status, body = tick(client, "explode", [target])
        assert status == 400 and "unknown action" in body
    assert everything(dsn) == before
