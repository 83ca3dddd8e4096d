"""A lean install: the core dependencies are a worker's, and each optional one fails in one clear
line where it is missing (psycopg's libpq, redis-py for the Redis coordinator) or is not needed at
all (uvloop)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from dispatcher import _libpq
from dispatcher.errors import ConfigError
from dispatcher.serve.worker import run_loop
from dispatcher.settings.config import Config
from dispatcher.settings.defaults import REDIS_REQUIREMENT

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip()


def test_core_forces_no_build_and_names_no_optional_package() -> None:
    core = PROJECT["dependencies"]
    assert "psycopg>=3.2" in core, "the pure package: libpq comes from an extra or the system"
    assert not any(r.startswith("psycopg[") for r in core)
    assert {_name(r) for r in core}.isdisjoint({"redis", "psycopg-binary", "psycopg-c"})
    (uvloop,) = (r for r in core if _name(r) == "uvloop")
    assert "sys_platform != 'win32'" in uvloop
    assert "platform_python_implementation == 'CPython'" in uvloop


def test_the_extras_are_the_ones_the_errors_name() -> None:
    extras = PROJECT["optional-dependencies"]
    assert extras["binary"] == [_libpq.BINARY_REQUIREMENT]
    assert extras["c"] == ["psycopg[c]>=3.2"]
    assert extras["redis"] == [REDIS_REQUIREMENT]


def test_a_worker_runs_on_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    seen: list[type[asyncio.AbstractEventLoop]] = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()))

    run_loop(main())
    assert seen and seen[0].__module__.startswith("asyncio")


def test_the_redis_coordinator_without_redis_py_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # find_spec answers None, as when absent
    with pytest.raises(ConfigError) as caught:
        Config(coordinator="redis", redis_url="redis://127.0.0.1:6379/0")
    assert caught.value.setting == "coordinator"
    assert f"pip install '{REDIS_REQUIREMENT}'" in str(caught.value)
    assert "\n" not in str(caught.value)
    # Another coordinator never needs redis-py, even with a Redis URL left in the environment.
    Config(coordinator="postgres", redis_url="redis://127.0.0.1:6379/0")


def test_psycopg_without_a_libpq_fails_at_import_in_one_line() -> None:
    """No psycopg_c, no psycopg_binary, and no libpq on the system (ctypes finds none)."""
    code = textwrap.dedent("""
        import ctypes.util, sys
        sys.modules["psycopg_c"] = sys.modules["psycopg_binary"] = None
        find = ctypes.util.find_library
        ctypes.util.find_library = lambda name: None if name == "pq" else find(name)
        try:
            import dispatcher
        except ImportError as exc:
            print(exc)
            sys.exit(1)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PSYCOPG", "PYTHON"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    (line,) = done.stdout.splitlines()
    assert line.startswith("psycopg found no libpq: install the `binary` extra"), line
    assert f"pip install '{_libpq.BINARY_REQUIREMENT}'" in line
    assert "libpq library not found" in line, "psycopg's own reason follows"
