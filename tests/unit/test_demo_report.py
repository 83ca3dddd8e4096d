"""The demo's report: the reading is computed from the figures it is given, never a fixed ratio."""

from __future__ import annotations

from dispatcher.devtools.demo_report import WHEN_EACH_MODE_WINS, Measurement, ModeResult, render


def results(burst_s: tuple[float, float], cold_s: tuple[float, float]) -> list[ModeResult]:
    return [
        ModeResult(mode, Measurement(1000, b, None, 3.0, 0), Measurement(1000, c, c / 2, 4.0, 1))
        for mode, b, c in zip(("partitioned", "skip_locked"), burst_s, cold_s, strict=True)
    ]


def test_reading_follows_the_figures() -> None:
    # partitioned drains the burst in half the time (2x the jobs/s), the cold start in twice the
    # time.
    text = render(results((0.5, 1.0), (4.0, 2.0)), jobs=1000, workers=3, cores=8)
    assert "2.00x on the ready-fleet burst, 0.50x on the cold start" in text
    assert "first claim 2.00 s vs 1.00 s after the spawn" in text
    assert "(3 worker processes per mode, 8 cores)" in text
    swapped = render(results((1.0, 0.5), (2.0, 4.0)), jobs=1000, workers=3, cores=8)
    assert "0.50x on the ready-fleet burst, 2.00x on the cold start" in swapped
    assert text.endswith(WHEN_EACH_MODE_WINS) and swapped.endswith(WHEN_EACH_MODE_WINS)


def test_table_rows_carry_both_measurements() -> None:
    lines = render(results((0.5, 1.0), (4.0, 2.0)), jobs=1000, workers=2, cores=2).splitlines()
    assert "burst from a ready fleet" in lines[0] and "cold start" in lines[0]
    assert lines[2].split() == [
        "partitioned",
        "0.500",
        "2,000",
        "3.00",
        "0",
        "2.000",
        "4.000",
        "250",
        "4.00",
        "1",
    ]
    assert lines[3].split() == [
        "skip_locked",
        "1.000",
        "1,000",
        "3.00",
        "0",
        "1.000",
        "2.000",
        "500",
        "4.00",
        "1",
    ]
