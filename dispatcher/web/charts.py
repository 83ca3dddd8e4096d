"""The dashboard's charts as geometry: axes, ticks and polyline points in a fixed viewBox, computed
here in plain Python and drawn as inline SVG by templates/_charts.html (no script, no inline
style: the lines' colours are classes of static/dashboard.css). Times are UTC.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from dispatcher.web.chart_reads import Series

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 30  # margins: the y labels, the x labels
EMPTY_TEXT = "no data in this span yet"


@dataclass(frozen=True, slots=True)
class Tick:
    at: float  # x or y in the viewBox
    label: str


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    css: str  # its class: the colour, in dashboard.css
    segments: list[str]  # "x,y x,y ..." of each run of two points or more between gaps
    dots: list[tuple[float, float]]  # points alone between gaps


@dataclass(frozen=True, slots=True)
class Chart:
    id: str
    title: str
    desc: str  # what it shows, and its latest values (the accessible description)
    unit: str
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    lines: list[Line]
    empty: bool
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above `value` (1 for nothing above 0)."""
    if not value > 0:
        return 1.0
    exp = 10.0 ** math.floor(math.log10(value))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * exp >= value * (1 - 1e-9):
            return m * exp
    return 10.0 * exp


# Round tops for an axis of seconds past a minute: whole minutes and hours, so the ticks (a top
# and its half) read as "2 min" and "1 min", not "1.7 min".
SECONDS_TOPS = (60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 21600, 43200, 86400)


def nice_seconds_ceiling(value: float) -> float:
    """nice_ceiling below a minute; above, the smallest of SECONDS_TOPS at or above `value`."""
    if value <= 60:
        return nice_ceiling(value) if value <= 50 else 60.0
    return float(next((t for t in SECONDS_TOPS if t >= value), nice_ceiling(value)))


def count_label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{round(value, 2):g}"


def seconds_label(value: float) -> str:
    if value == 0:
        return "0"
    if value < 1:
        return f"{round(value * 1000, 1):g} ms"
    if value < 60:
        return f"{round(value, 1):g} s"
    if value < 3600:
        return f"{round(value / 60, 1):g} min"
    return f"{round(value / 3600, 1):g} h"


def _x_ticks(starts: Sequence[datetime], step_s: int) -> list[Tick]:
    every_s = 600 if step_s < 600 else 4 * 3600  # a label each 10 minutes (1h), 4 hours (24h)
    n = len(starts)
    ticks = []
    for i, start in enumerate(starts):
        if int(start.timestamp()) % every_s == 0:
            x = LEFT + (WIDTH - LEFT - RIGHT) * (i / (n - 1) if n > 1 else 0.0)
            ticks.append(Tick(round(x, 1), start.strftime("%H:%M")))
    return ticks


def _line(name: str, css: str, values: Sequence[float | None], top: float) -> Line:
    n, width, height = len(values), WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    runs: list[list[tuple[float, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        x = LEFT + width * (i / (n - 1) if n > 1 else 0.0)
        y = TOP + height * (1 - min(v, top) / top)
        runs[-1].append((round(x, 1), round(y, 1)))
    segments = [" ".join(f"{x:g},{y:g}" for x, y in run) for run in runs if len(run) > 1]
    dots = [run[0] for run in runs if len(run) == 1]
    return Line(name, css, segments, dots)


def chart(
    id: str,
    title: str,
    unit: str,
    series: Series,
    lines: Sequence[tuple[str, str, Sequence[float | None]]],
    label: Callable[[float], str] = count_label,
    ceiling: Callable[[float], float] = nice_ceiling,
) -> Chart:
    """A chart of `lines` ((name, css class, values) over `series`' points): the y axis from 0 to
    a round value above the largest, three labelled ticks, a time label every 10 minutes (1h) or
    4 hours (24h)."""
    present = [v for _, _, values in lines for v in values if v is not None]
    top = ceiling(max(present, default=0.0))
    height = HEIGHT - TOP - BOTTOM
    y_ticks = [Tick(round(TOP + height * (1 - f), 1), label(top * f)) for f in (0.0, 0.5, 1.0)]
    latest = []
    for name, _, values in lines:
        last = next((v for v in reversed(values) if v is not None), None)
        latest.append(f"{name} {label(last) if last is not None else 'none'}")
    span = "the last hour, per minute" if series.span == "1h" else "the last 24 hours, per 10 min"
    desc = f"{title} over {span} (UTC). Latest: {', '.join(latest)}."
    return Chart(
        id,
        title,
        desc,
        unit,
        _x_ticks(series.starts, series.step_s),
        y_ticks,
        [_line(n, css, v if series.any_data else [], top) for n, css, v in lines],
        not series.any_data,
    )


def charts_of(series: Series, prefix: str = "chart") -> list[Chart]:
    """The three charts of a page: finished and failed, depth, queue wait p50 and p99."""
    return [
        chart(
            f"{prefix}-throughput",
            "Finished and failed per minute",
            "attempts/min",
            series,
            [
                ("finished", "s-finished", series.finished_per_min),
                ("failed", "s-failed", series.failed_per_min),
            ],
        ),
        chart(
            f"{prefix}-depth",
            "Queue depth (due jobs)",
            "jobs",
            series,
            [("due", "s-depth", [None if d is None else float(d) for d in series.depth])],
        ),
        chart(
            f"{prefix}-wait",
            "Queue wait, due to claimed",
            "seconds",
            series,
            [("p50", "s-p50", series.wait_p50_s), ("p99", "s-p99", series.wait_p99_s)],
            seconds_label,
            nice_seconds_ceiling,
        ),
    ]
