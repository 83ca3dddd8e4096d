"""The bench suite is run from a checkout (`python -m bench`, `make bench`), never by the
installed CLI.

It needs what a wheel does not carry (bench/ with its scenarios and results, matplotlib), so
`dispatcher` offers no `bench` command, and no entry point of the repository spells one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.cli.commands import build_parser

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHER_", "PYTHON"))}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dispatcher_help_offers_no_bench() -> None:
    done = run("-m", "dispatcher", "--help")
    assert done.returncode == 0, done.stderr
    assert "demo" in done.stdout and "bench" not in done.stdout


def test_dispatcher_bench_is_an_unknown_command() -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "all", "--quick"])
    assert exit_.value.code == 2


def test_python_m_bench_runs_from_the_checkout() -> None:
    done = run("-m", "bench", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m bench") and "--quick" in done.stdout


ENTRY_POINTS = [
    ".ci/run",
    "Makefile",
    "README.md",
    "Dockerfile",
    "k8s/bench/bench-job.yaml",
    "k8s/bench/kustomization.yaml",
    "bench/__main__.py",
    "bench/RESULTS.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")),
]


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_no_entry_point_or_guide_runs_dispatcher_bench(path: str) -> None:
    assert "dispatcher bench" not in (REPO / path).read_text()


def test_ci_smoke_runs_the_bench_as_a_module() -> None:
    assert "python -m bench all --quick" in (REPO / ".ci/run").read_text()
