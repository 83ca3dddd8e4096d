"""Tags on the dashboard over plain HTTP: the jobs list filters by them (jobs carrying every tag
given) and shows them, the job page shows them as links to that filter, a tag written into the
row by hand is shown escaped, and a bulk change by tag confirms and changes exactly the jobs
carrying it."""

from __future__ import annotations

import html
import re

import psycopg
import pytest

from dispatcher.api.enqueue import enqueue_sync
from tests.web.support import HOSTILE, Client, served, statuses


@pytest.fixture
def tagged(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = {
            "a": enqueue_sync(conn, "t", tags=["a"]),
            "ab": enqueue_sync(conn, "t", tags=["a", "b"]),
            "b": enqueue_sync(conn, "t", tags=["b"]),
            "none": enqueue_sync(conn, "t"),
            "hostile": enqueue_sync(conn, "t", tags=["hostile"]),
        }
        # Enqueue refuses such a tag; a row written by other means may still hold one.
        conn.execute(
            "UPDATE dispatcher_jobs SET tags = ARRAY['hostile', %s] WHERE id = %s",
            (HOSTILE, ids["hostile"]),
        )
    return dsn, ids


def listed(page: str) -> set[int]:
    return {int(i) for i in re.findall(r'<tr data-job-id="(\d+)"', page)}


def test_the_jobs_list_filters_by_tags_and_shows_them_escaped(tagged):
    dsn, ids = tagged
    with served(dsn) as web:
        client = Client(web.url)
        status, _, page = client.request("/jobs?tag=a")
        assert status == 200 and listed(page) == {ids["a"], ids["ab"]}
        assert 'name="tag" value="a"' in page, "the form keeps the filter"
        assert listed(client.request("/jobs?tag=a,b")[2]) == {ids["ab"]}
        assert listed(client.request("/jobs?tag=b%2C+a")[2]) == {ids["ab"]}
        assert len(listed(client.request("/jobs")[2])) == 5
        row = re.search(rf'<tr data-job-id="{ids["ab"]}".*?</tr>', page, re.S)
        assert row and '<span class="tag">a</span> <span class="tag">b</span>' in row[0]
        status, _, body = client.request("/jobs?tag=not+a+tag")
        assert status == 400 and "is not a tag" in body
        for path in ("/jobs?tag=hostile", f"/jobs/{ids['hostile']}"):
            body = client.request(path)[2]
            assert "<script>window" not in body and "<img src=x" not in body, path
            assert HOSTILE in html.unescape(body), ("the tag is shown, as text", path)


def test_the_job_page_shows_its_tags_as_links_to_the_list(tagged):
    dsn, ids = tagged
    with served(dsn) as web:
        client = Client(web.url)
        page = client.request(f"/jobs/{ids['ab']}")[2]
        cell = re.search(r'<td id="job-tags">(.*?)</td>', page, re.S)
        assert cell, page[-1500:]
        assert re.findall(r'<a class="tag" href="/jobs\?tag=([^"]+)">([^<]+)</a>', cell[1]) == [
            ("a", "a"),
            ("b", "b"),
        ]
        assert 'id="job-tags"' not in client.request(f"/jobs/{ids['none']}")[2]


def test_a_bulk_cancel_by_tag_confirms_then_cancels_exactly_the_jobs_carrying_it(tagged):
    dsn, ids = tagged
    with served(dsn, web_allow_actions=True) as web:
        client = Client(web.url)
        assert 'id="bulk-cancel"' in client.request("/jobs?tag=b")[2]
        status, _, page = client.request("/actions/confirm?action=cancel&tag=b")
        assert status == 200, page[-800:]
        assert re.search(r'id="matching"><strong>(\d+)</strong>', page)[1] == "2"
        form = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', page))
        assert form["tag"] == "b"
        status, _, result = client.request("/actions/cancel", form)
        assert status == 200 and "2 changed" in result, result[-800:]
    assert statuses(dsn, list(ids.values())) == {
        ids["a"]: "queued",
        ids["ab"]: "cancelled",
        ids["b"]: "cancelled",
        ids["none"]: "queued",
        ids["hostile"]: "queued",
    }
