"""`dispatcher demo` end to end on a small burst: both labelled measurements (ready-fleet burst,
cold start) for both modes in one unbroken table, a line explaining each column, this run's reading
computed from the table's own figures, the fixed text on when each mode wins, and not one worker
log line in what the user sees (stdout and stderr merged, as on a terminal)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from dispatcher.constants import MODES
from dispatcher.devtools.demo_report import WHEN_EACH_MODE_WINS, column_notes
from tests.helpers import ROOT

JOBS, WORKERS = 400, 2
# A log line in either format (logs.py): text "2025-01-31 09:14:03,512 INFO name: ..." or JSON.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ |^\{\"ts\"|worker=")
PROGRESS = re.compile(r"^  (\w+): (burst|cold start) +\[#+\] +\d+/\d+ +\d+ jobs/s$")
NUMBER = r"([\d,]+(?:\.\d+)?)"
ROW = re.compile(rf"^(\w+) +{' +'.join([NUMBER] * 9)}$")


def run_demo(dsn: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    # INFO (the default) makes every worker log at start and stop: lines that would show if leaked.
    env.update(DISPATCHER_DSN=dsn, DISPATCHER_LOG_LEVEL="INFO")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher",
            "demo",
            "--jobs",
            str(JOBS),
            "--workers",
            str(WORKERS),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0, r.stdout
    return r.stdout


def test_demo_table_reading_and_no_log_lines(dsn: str) -> None:
    out = run_demo(dsn)
    lines = out.splitlines()
    leaked = [line for line in lines if LOG_LINE.search(line)]
    assert leaked == [], out

    # One progress line per run (not a terminal), all before the table.
    progress = [(i, PROGRESS.match(line)) for i, line in enumerate(lines) if PROGRESS.match(line)]
    assert sorted((m[1], m[2]) for _, m in progress) == sorted(
        (mode, run) for mode in MODES for run in ("burst", "cold start")
    ), out

    # The table: group labels, headings, then one row per mode, with nothing in between.
    top = next(i for i, line in enumerate(lines) if "burst from a ready fleet" in line)
    assert "cold start" in lines[top] and top > max(i for i, _ in progress), out
    assert lines[top + 1].split() == [
        "mode",
        "burst",
        "s",
        "jobs/s",
        "reads/job",
        "waiters",
        "1st",
        "claim",
        "s",
        "cold",
        "s",
        "jobs/s",
        "reads/job",
        "waiters",
    ], out
    rows = {}
    for line in lines[top + 2 : top + 2 + len(MODES)]:
        m = ROW.match(line)
        assert m, (line, out)
        rows[m[1]] = [float(x.replace(",", "")) for x in m.groups()[1:]]
    assert sorted(rows) == sorted(MODES), out
    for figures in rows.values():
        burst_s, burst_rate, _, _, first_claim_s, cold_s, cold_rate, _, _ = figures
        assert burst_s > 0 and 0 < first_claim_s <= cold_s, out
        for seconds, rate in ((burst_s, burst_rate), (cold_s, cold_rate)):
            # jobs/s is computed from the unrounded seconds, printed to the millisecond.
            assert JOBS / (seconds + 0.0005) - 1 <= rate <= JOBS / (seconds - 0.0005) + 1, out

    # A line explaining each column, under the table.
    for name, text in column_notes(JOBS, WORKERS):
        assert any(line.startswith(name + " ") and line.endswith(text) for line in lines[top:]), (
            name,
            out,
        )

    # The reading, from this run's figures: the ratios agree with the table's jobs/s.
    m = re.search(r"(\d+\.\d\d)x on the ready-fleet burst, (\d+\.\d\d)x on the cold start", out)
    assert m, out
    first, second = (rows[mode] for mode in MODES)
    assert abs(float(m[1]) - first[1] / second[1]) <= 0.02 * float(m[1]) + 0.01, out
    assert abs(float(m[2]) - first[6] / second[6]) <= 0.02 * float(m[2]) + 0.01, out
    assert f"{WORKERS} worker processes per mode" in out
    assert out.rstrip().endswith(WHEN_EACH_MODE_WINS), out
