"""The charts' pure parts: percentiles from wait histograms, a span's points (gaps filled), the SVG
geometry and its escaping, and the stats flusher's delta and baseline (no database)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import jinja2
import pytest

from dispatcher.errors import StoreUnavailable
from dispatcher.observe.job_metrics import WAIT_BUCKETS_S, JobStats
from dispatcher.runtime.queue_stats import Baseline, StatsFlusher, totals
from dispatcher.web import charts
from dispatcher.web.app import HERE
from dispatcher.web.chart_reads import StatsPoint, percentile, series_of

N_WAITS = len(WAIT_BUCKETS_S) + 1
ANCHOR = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _hist(**at_bound: int) -> list[int]:
    counts = [0] * N_WAITS
    for key, n in at_bound.items():
        counts[int(key[1:])] = n
    return counts


def test_percentiles_interpolate_within_their_bucket():
    # 100 waits in (0.5, 1.0]: the median is halfway, p99 near the top
    counts = _hist(b7=100)
    assert WAIT_BUCKETS_S[6:8] == (0.5, 1.0)
    assert percentile(counts, 0.5) == pytest.approx(0.75)
    assert percentile(counts, 0.99) == pytest.approx(0.995)
    # the first bucket starts at 0
    assert percentile(_hist(b0=10), 0.5) == pytest.approx(0.0025)
    # 90 fast, 10 slow: p50 among the fast ones, p99 among the slow
    mixed = _hist(b0=90, b12=10)
    assert percentile(mixed, 0.5) < 0.005 and percentile(mixed, 0.99) == pytest.approx(
        57.0
    )  # (30, 60]: 90% of it
    # above every bound: the largest bound, a lower bound
    assert percentile(_hist(b20=3), 0.99) == WAIT_BUCKETS_S[-1]
    assert percentile([0] * N_WAITS, 0.5) is None and percentile([], 0.5) is None


def _point(minutes_ago: int, step_s: int = 60, **kw: Any) -> StatsPoint:
    at = ANCHOR - timedelta(seconds=step_s * minutes_ago)
    return StatsPoint(
        at, kw.get("finished", 0), kw.get("failed", 0), kw.get("depth"), kw.get("waits")
    )


def test_a_span_has_every_point_and_fills_gaps():
    s = series_of(
        [_point(0, finished=30, failed=2, depth=7, waits=_hist(b7=4)), _point(5, finished=6)],
        ANCHOR,
        "1h",
    )
    assert (
        len(s.starts) == 60
        and s.starts[-1] == ANCHOR
        and s.starts[0] == ANCHOR - timedelta(minutes=59)
    )
    assert (
        s.finished_per_min[-1] == 30 and s.failed_per_min[-1] == 2 and s.finished_per_min[-6] == 6
    )
    assert s.finished_per_min[-2] == 0 and s.depth[-2] is None and s.depth[-1] == 7
    assert s.wait_p50_s[-1] == pytest.approx(0.75) and s.wait_p50_s[-6] is None
    day = series_of([_point(143, 600, finished=600)], ANCHOR, "24h")
    assert len(day.starts) == 144 and day.step_s == 600
    # a 10-minute point shows its average per minute
    assert day.finished_per_min[0] == 60 and day.any_data
    assert not series_of([], ANCHOR, "1h").any_data


def test_nice_ceilings_and_labels():
    assert [charts.nice_ceiling(v) for v in (0, 0.3, 1, 1.1, 3, 7, 4500)] == [
        1,
        0.5,
        1,
        2,
        5,
        10,
        5000,
    ]
    assert charts.seconds_label(0.25) == "250 ms" and charts.seconds_label(90) == "1.5 min"
    assert charts.seconds_label(5400) == "1.5 h" and charts.count_label(2500) == "2.5k"


def test_a_seconds_axis_tops_at_whole_minutes_and_hours():
    assert [charts.nice_seconds_ceiling(v) for v in (0.3, 7, 45, 55, 100, 200, 4000)] == [
        0.5,
        10,
        50,
        60,
        120,
        300,
        7200,
    ]
    assert charts.seconds_label(120 / 2) == "1 min"  # the half tick of a 2 min top
    assert charts.nice_seconds_ceiling(10**6) == 10**6


def test_the_point_still_filling_is_a_rate_over_its_part_gone_by():
    # 10 jobs in the first 20 s of the current minute: 30/min, not a dip to 10
    s = series_of([_point(0, finished=10), _point(1, finished=30)], ANCHOR, "1h", elapsed_s=20)
    assert s.finished_per_min[-2:] == [30.0, 30.0]
    # a few seconds in, one flush does not read as a spike: at least 15 s are taken
    early = series_of([_point(0, finished=5)], ANCHOR, "1h", elapsed_s=2)
    assert early.finished_per_min[-1] == pytest.approx(20.0)
    # the 24h span's last point: 100 jobs in 5 of its 10 minutes, 20/min
    day = series_of([_point(0, 600, finished=100)], ANCHOR, "24h", elapsed_s=300)
    assert day.finished_per_min[-1] == pytest.approx(20.0)


def test_the_geometry_of_a_line_with_a_gap():
    values: list[float | None] = [None] * 60
    values[10], values[11], values[30] = 10.0, 5.0, 10.0
    s = series_of([_point(0, finished=1)], ANCHOR, "1h")
    c = charts.chart("c", "T", "u", s, [("a", "s-a", values)])
    (line,) = c.lines
    assert len(line.segments) == 1 and len(line.dots) == 1
    (x0, y0), (_, y1) = (tuple(map(float, p.split(","))) for p in line.segments[0].split())
    width = charts.WIDTH - charts.LEFT - charts.RIGHT
    assert x0 == pytest.approx(charts.LEFT + width * 10 / 59, abs=0.1)
    assert y0 == charts.TOP  # 10 is the top of the axis
    assert y1 == pytest.approx((charts.TOP + c.bottom) / 2, abs=0.1)  # 5: halfway
    assert [t.label for t in c.y_ticks] == ["0", "5", "10"]
    # a label every 10 minutes, at whole tens (UTC)
    assert [t.label for t in c.x_ticks] == ["11:10", "11:20", "11:30", "11:40", "11:50", "12:00"]


def _render(chart_list: list[charts.Chart]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    tmpl = env.from_string(
        '{% from "_charts.html" import charts %}{{ charts(cs, "1h", "/q/<x>") }}'
    )
    return tmpl.render(cs=chart_list)


def test_svg_escapes_its_text_and_says_when_there_is_no_data():
    empty = series_of([], ANCHOR, "1h")
    body = _render(charts.charts_of(empty))
    assert body.count("<svg") == 3 and body.count("no data in this span yet") == 3
    assert "<polyline" not in body and " style=" not in body and "<title" in body
    assert "/q/&lt;x&gt;?span=24h" in body
    hostile = charts.chart("h", "<script>x</script>", "u", empty, [("<b>", "s-a", [])])
    body = _render([hostile])
    assert "<script>" not in body and "&lt;script&gt;" in body and "<b>" not in body
    full = series_of(
        [_point(i, finished=i, failed=1, depth=3, waits=_hist(b5=2)) for i in range(60)],
        ANCHOR,
        "1h",
    )
    body = _render(charts.charts_of(full))
    assert "no data" not in body and body.count("<polyline") == 5


class FakeStore:
    """A store whose statements are recorded, or fail while `fail` is set."""

    worker_id = "w1"

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.fail = False

    async def run(self, what: str, work: Any, **kw: Any) -> Any:
        if self.fail:
            raise StoreUnavailable("the database went away")

        class Conn:
            @contextlib.asynccontextmanager
            async def transaction(conn) -> AsyncIterator[None]:
                yield

            async def execute(conn, sql: str, params: dict[str, Any]) -> None:
                if "queues" in params:  # not the flush's bound
                    self.written.append(params)

        return await work(Conn())


def _sums(written: list[dict[str, Any]], queue: str) -> tuple[int, int]:
    finished = failed = 0
    for params in written:
        for q, f, x in zip(params["queues"], params["finished"], params["failed"], strict=True):
            if q == queue:
                finished, failed = finished + f, failed + x
    return finished, failed


def test_the_flusher_writes_each_count_once_and_keeps_a_failed_flush_for_the_next():
    stats = JobStats()
    store = FakeStore()
    flusher, other = StatsFlusher(store, stats=stats), StatsFlusher(store, stats=stats)  # type: ignore[arg-type]

    async def main() -> None:
        assert not await flusher.flush() and store.written == []  # nothing: no statement
        stats.finished("q", "t", "completed", 0.01)
        stats.finished("q", "t", "retried", 0.01)
        stats.waited("q", [0.15, 0.2])  # both in (0.1, 0.25]
        assert await flusher.flush()
        assert _sums(store.written, "q") == (1, 1)
        assert store.written[0]["waits"] == ["{0,0,0,0,0,2,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}"]
        stats.finished("q", "t", "completed", 0.01)
        stats.finished("q", "t", "discarded", 0.01)
        store.fail = True
        with pytest.raises(StoreUnavailable):
            await flusher.flush()
        stats.finished("q", "t", "completed", 0.01)
        stats.finished("q", "t", "cancelled", 0.01)  # neither finished nor failed
        store.fail = False
        # another worker's flusher in the same process writes what the failed one did not
        assert await other.flush()
        assert _sums(store.written, "q") == (3, 2) and len(store.written) == 2
        assert not await flusher.flush()

    asyncio.run(main())


def test_one_flush_at_a_time_per_process():
    stats = JobStats()
    baseline = Baseline(stats)
    stats.finished("q", "t", "completed", 0.01)
    first = baseline.take()
    assert first is not None and baseline.take() is None  # the other waits for the next round
    baseline.commit(first[0])
    again = baseline.take()
    assert again is not None and again[1] == {}
    baseline.abandon()
    assert totals(stats)["q"].finished == 1
