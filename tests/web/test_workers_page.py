"""The dashboard's workers page and the overview's worker count read the worker registry: every
live worker whatever its mode and coordinator, with each of its fields, escaped; the ones gone
within the hour marked; older ones not at all."""

from __future__ import annotations

import html
import re

import psycopg

from tests.integration.test_worker_registry import LIVE, register, register_fleet
from tests.web.support import HOSTILE, Client, served

ROW = re.compile(
    r'<tr(?: class="(?P<cls>[a-z]+)")? data-worker="(?P<id>[^"]*)" data-live="(?P<live>[01])">'
    r"(?P<cells>.*?)</tr>",
    re.S,
)


def cells(row: str) -> list[str]:
    return [
        html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    ]


def test_the_workers_page_lists_the_registrys_live_workers_and_marks_the_gone_ones(dsn):
    register_fleet(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        register(conn, HOSTILE, "skip_locked", "none", host=HOSTILE, queues=("hostile",))
    with served(dsn) as web:
        client = Client(web.url)
        status, _, body = client.request("/workers")
        assert status == 200, body[:500]
        overview = client.request("/")[2]

    rows = {html.unescape(m["id"]): m for m in ROW.finditer(body)}
    live = {i for i, m in rows.items() if m["live"] == "1"}
    assert live == {*LIVE, HOSTILE}
    for worker_id, (mode, coordinator) in LIVE.items():
        shown = cells(rows[worker_id]["cells"])
        assert shown[:8] == [
            worker_id,
            "pod-a",
            "4242",
            "9.9.9",
            mode,
            coordinator,
            "default, mail",
            "3/20",
        ]
        assert shown[8] == "2m" and shown[9].endswith("ago") and shown[10] == "live", shown
    # Gone within the hour: listed, greyed, and marked how they left; gone longer: not listed.
    gone = {i: m for i, m in rows.items() if m["live"] == "0"}
    assert set(gone) == {"w-killed", "w-stopped"}
    assert {m["cls"] for m in gone.values()} == {"gone"}
    assert cells(gone["w-killed"]["cells"])[-1] == "gone: lease ran out"
    assert cells(gone["w-stopped"]["cells"])[-1] == "stopped"
    assert "w-old" not in body
    assert "4 live, 2 gone within the hour" in body

    # A worker's id and host are text: escaped wherever they are shown.
    assert "<script>window" not in body and "<img src=x" not in body
    hostile = cells(rows[HOSTILE]["cells"])
    assert hostile[:2] == [HOSTILE, HOSTILE] and hostile[4:6] == ["skip_locked", "none"]

    # The overview counts the live workers serving each queue, whatever their mode.
    def workers_of(queue: str) -> str:
        row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', overview, re.S)
        assert row, f"{queue} is on the overview"
        return cells(row[1])[-2]

    assert (workers_of("default"), workers_of("mail"), workers_of("hostile")) == ("3", "3", "1")


def test_the_workers_page_lists_job_types_no_live_worker_serves_escaped(dsn):
    from dispatcher import enqueue_sync

    with psycopg.connect(dsn, autocommit=True) as conn:
        register(conn, "w-live", "skip_locked", "none", queues=("default",))
        enqueue_sync(conn, "send_email", {})  # served
        typo = enqueue_sync(conn, "typo", {})
        # enqueue refuses such a name: written behind its back, as a page must expect anything
        conn.execute("UPDATE dispatcher_jobs SET job_type = %s WHERE id = %s", (HOSTILE, typo))
    with served(dsn) as web:
        body = Client(web.url).request("/workers")[2]
    table = body.split('id="unserved"')[1].split("</table>")[0]
    assert HOSTILE in html.unescape(table), "the unserved type is listed, as text"
    assert "<script" not in table and "<img" not in table
    assert "send_email" not in table, "a type a live worker serves is not"
