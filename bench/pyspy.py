"""Where a worker's CPU goes during the drain (`--py-spy`): py-spy samples one worker process over
the same window as the CPU figures (costs.py), and the report lists the functions the samples
were in (their own time, not their callees'), as a share of the samples and in µs per job.

py-spy is not a dependency of the project: `pip install py-spy`. It reads the process's memory
(ptrace): as root, or where /proc/sys/kernel/yama/ptrace_scope allows it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

RECORDING: dict[str, Path | None] = {"dir": None, "exe": None}  # set by `python -m bench --py-spy`
RATE_HZ = 200
_LINE = re.compile(r":\d+\)$")


def enable(out_dir: Path) -> None:
    """Raises SystemExit with one line where py-spy is not installed."""
    # On PATH, or beside this interpreter (a virtualenv's bin/ when it is not activated).
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if exe is None:
        raise SystemExit("bench: --py-spy needs py-spy (pip install py-spy)")
    RECORDING.update(dir=out_dir, exe=Path(exe))


class Sampler:
    """py-spy on one process from start() to stop(); its raw stacks go to `path`."""

    def __init__(self, pid: int, path: Path) -> None:
        self._pid, self.path = pid, path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [
                str(RECORDING["exe"]),
                "record",
                "--pid",
                str(self._pid),
                "--rate",
                str(RATE_HZ),
                "--format",
                "raw",
                "--output",
                str(self.path),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            _, err = self._proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            raise RuntimeError(f"py-spy did not stop within 30 s (pid {self._pid})") from None
        if not self.path.exists():
            raise RuntimeError(
                f"py-spy wrote nothing for pid {self._pid}: {err.decode(errors='replace').strip()}"
            )


def own_time(raw: str) -> Counter[str]:
    """Samples per function (file, not line) at the top of the stack, from py-spy's raw format
    ('frame;frame;...;frame count' per line, innermost last)."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[_LINE.sub(")", stack.rsplit(";", 1)[-1])] += int(count)
    return counts


def top(raw: str, client_us_per_job: float, n: int = 12) -> list[dict[str, Any]]:
    """The n functions with the most samples: share of the samples and, spread over the worker's
    client CPU per job, µs per job (py-spy samples running threads only: the share is of CPU)."""
    counts = own_time(raw)
    total = sum(counts.values())
    return (
        [
            {
                "function": name,
                "share": round(c / total, 3),
                "us_per_job": round(client_us_per_job * c / total, 2),
            }
            for name, c in counts.most_common(n)
        ]
        if total
        else []
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"  {'function (own time)':<78}{'share':>7}{'us/job':>8}"]
    lines += [f"  {r['function'][:77]:<78}{r['share']:>7.1%}{r['us_per_job']:>8.2f}" for r in rows]
    return "\n".join(lines)
