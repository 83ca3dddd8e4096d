"""docs/examples/typed_app.py: `mypy --strict` passes on it, and refuses a wrong argument to a
task's enqueue (the typing bites); its tasks run with the arguments they were enqueued with."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from dispatcher.testing import MemoryStore, Runner, assert_enqueued, perform_job
from tests.helpers import ROOT

EXAMPLES = ROOT / "docs" / "examples"
APP = EXAMPLES / "typed_app.py"

# Each line marked `# E: code` must get exactly that error from mypy, and no other line any.
MISUSE = textwrap.dedent("""\
    from typing import Any

    import psycopg

    from typed_app import make_thumbnail, send_email


    def misuse(conn: psycopg.Connection[Any]) -> None:
        send_email.enqueue_sync(conn, 42, "Welcome")  # E: arg-type
        send_email.enqueue_sync(conn, "ada@example.com")  # E: call-arg
        make_thumbnail.with_options(priority=1).enqueue_sync(conn, 7, width="large")  # E: arg-type
        send_email.with_options(queu="emails")  # E: call-arg
        make_thumbnail.spec("seven")  # E: arg-type
        width: str = make_thumbnail(7)  # E: assignment
""")


def mypy(path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    # MYPYPATH: the editable install's finder is not mypy's; docs/examples holds typed_app
    env = {**os.environ, "MYPYPATH": os.pathsep.join([str(ROOT), str(EXAMPLES)])}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy_cache")  # shared: the second run reuses the first's


def test_mypy_strict_passes_on_the_typed_example(mypy_cache: Path) -> None:
    result = mypy(APP, mypy_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found in 1 source file")


def test_mypy_strict_refuses_wrong_arguments_to_a_tasks_enqueue(
    mypy_cache: Path, tmp_path: Path
) -> None:
    misuse = tmp_path / "misuse.py"
    misuse.write_text(MISUSE, encoding="utf-8")
    result = mypy(misuse, mypy_cache)
    assert result.returncode == 1, result.stdout + result.stderr
    found = {
        (int(line), code)
        for line, code in re.findall(
            r"^[^:]*misuse\.py:(\d+): error: .*\[([\w-]+)\]$", result.stdout, flags=re.MULTILINE
        )
    }
    expected = {
        (n, code)
        for n, text in enumerate(MISUSE.splitlines(), 1)
        if (code := text.partition("# E: ")[2])
    }
    assert found == expected, result.stdout


@pytest.fixture(scope="module")
def app() -> ModuleType:
    spec = importlib.util.spec_from_file_location("typed_app", APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_tasks_run_with_their_arguments(app: ModuleType) -> None:
    store = MemoryStore()
    assert app.sign_up(store, "ada@example.com") is not None
    assert app.sign_up(store, "ada@example.com") is None  # the welcome's dedupe key is held
    assert app.upload_album(store, [1, 2]) == 2
    asyncio.run(app.notify(store, "ada@example.com"))
    welcome = assert_enqueued(store, app.send_email, {"subject": "Welcome"}, queue="emails")
    assert welcome.run_at > store.clock.now()  # delay_s=60
    Runner(store, app.registry).drain()
    assert sorted(app.outbox) == [
        ("ada@example.com", "Welcome", ["team@example.com"], 1),
        ("ada@example.com", "Your album is ready", [], 1),
    ]
    assert app.thumbnails == {1: 128, 2: 128}
    assert perform_job(app.make_thumbnail, 3) == 200
