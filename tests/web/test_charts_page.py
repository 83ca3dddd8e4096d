"""The charts over HTTP against a real PostgreSQL: the overview and a queue's page draw them from
the per-minute rollup and the workers' rows (written here as the stats flusher and the rollup
would), with the expected points; without data they draw the axes and say so; the span switch and
the live fragment carry them."""

from __future__ import annotations

import re

import psycopg
import pytest

from dispatcher.observe.job_metrics import WAIT_BUCKETS_S
from dispatcher.web import charts
from tests.web.support import SEEDED, Client, seed, served

N_WAITS = len(WAIT_BUCKETS_S) + 1


def _figure(body: str, chart_id: str) -> str:
    found = re.search(rf'<figure class="chart" id="{chart_id}".*?</figure>', body, re.S)
    assert found, f"no {chart_id} chart"
    return found[0]


def _points(figure: str, css: str) -> list[tuple[float, float]]:
    series = re.search(rf'<g class="series {css}"[^>]*>(.*?)</g>', figure, re.S)
    assert series, css
    return [
        (float(x), float(y))
        for line in re.findall(r'<polyline points="([^"]*)"', series[1])
        for x, y in (p.split(",") for p in line.split())
    ]


@pytest.fixture
def seeded(dsn):
    seed(dsn)
    return dsn


def test_without_data_the_charts_draw_their_axes_and_say_so(seeded):
    with served(seeded) as web:
        client = Client(web.url)
        for path in ("/", f"/queues/{SEEDED}", "/queues/nothing-here", "/?span=24h"):
            status, _, body = client.request(path)
            assert status == 200, (path, body[:300])
            assert body.count("<svg") == 3 and body.count("no data in this span yet") == 3, path
            assert "<polyline" not in body and " style=" not in body
        assert client.request("/?span=7d")[0] == 400
        assert "No jobs in this queue now" in client.request("/queues/nothing-here")[2]


def test_the_charts_show_the_rolled_up_minutes_and_the_workers_rows(seeded):
    dsn = seeded
    waits = [0] * N_WAITS
    waits[7] = 10  # ten waits in (0.5 s, 1 s]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dispatcher_stats_by_minute"
            " (minute, queue_name, finished, failed, waits, wait_sum_s, depth) VALUES"
            " (date_trunc('minute', now()) - interval '3 minutes', %(q)s, 10, 1, %(w)s, 7.5, 40),"
            " (date_trunc('minute', now()) - interval '2 minutes', 'other', 5, 0, NULL, 0, 2)",
            {"q": SEEDED, "w": waits},
        )
        conn.execute(
            "INSERT INTO dispatcher_stats_by_worker"
            " (minute, queue_name, worker_id, finished, failed, waits) VALUES"
            " (date_trunc('minute', now()) - interval '2 minutes', %(q)s, 'w1', 12, 0, %(w)s),"
            " (date_trunc('minute', now()) - interval '2 minutes', %(q)s, 'w2', 8, 2, %(w)s)",
            {"q": SEEDED, "w": waits},
        )
    with served(dsn) as web:
        client = Client(web.url)
        status, _, body = client.request(f"/queues/{SEEDED}")
        assert status == 200 and "no data in this span yet" not in body
        assert re.search(rf'<tr data-queue="{SEEDED}">', body), "the queue's counts"
        throughput = _figure(body, "chart-throughput")
        finished = _points(throughput, "s-finished")
        assert len(finished) == 60  # one point a minute, gaps at 0
        bottom, top = charts.HEIGHT - charts.BOTTOM, charts.TOP
        # 20 finished (two workers' rows, not rolled yet) at the top of a 0-20 axis, after 10
        ys = [y for _, y in finished]
        at_top = ys.index(top)
        assert ys[at_top - 1] == pytest.approx((top + bottom) / 2, abs=0.1)
        assert {y for i, y in enumerate(ys) if i not in (at_top, at_top - 1)} == {bottom}
        assert ">20<" in throughput and "Latest: finished 0, failed 0" in throughput
        failed = [y for _, y in _points(throughput, "s-failed")]
        assert failed[at_top] == pytest.approx(bottom - (bottom - top) * 2 / 20, abs=0.1)
        depth = _figure(body, "chart-depth")
        assert "<circle" in depth and ">50<" in depth  # one sample (40): a dot, axis to 50
        wait = _figure(body, "chart-wait")
        # the two minutes with waits, each in (0.5 s, 1 s]: p50 750 ms, p99 995 ms
        assert len(_points(wait, "s-p50")) == 2 and "p50 750 ms, p99 995 ms" in wait
        # the overview sums every queue; the other queue's minute is there too
        overview = client.request("/")[2]
        assert len(_points(_figure(overview, "chart-throughput"), "s-finished")) == 60
        assert "finished 0" in overview and "/queues/" + SEEDED in overview
        day = client.request(f"/queues/{SEEDED}?span=24h")[2]
        assert len(_points(_figure(day, "chart-throughput"), "s-finished")) == 144
        assert '<strong aria-current="true">24h</strong>' in day
        fragment = client.request("/", headers={"X-Dispatcher-Fragment": "1"})[2]
        assert "<svg" in fragment and "<html" not in fragment
