"""Worker processes started by the harness (demo, bench, multi-process tests) find the project's
bytecode written, as an installed package has it, instead of compiling every module at start."""

import importlib.util
import py_compile
from pathlib import Path

import coordinator.coordinator
import dispatcher.serve.worker
from dispatcher.devtools import harness


def _cached(module: object) -> Path:
    return Path(importlib.util.cache_from_source(module.__file__))  # type: ignore[attr-defined]


def test_precompile_writes_the_bytecode_of_both_packages_once(monkeypatch):
    targets = [_cached(dispatcher.serve.worker), _cached(coordinator.coordinator)]
    for pyc in targets:
        # gitignored; an import meanwhile would just compile from source
        pyc.unlink(missing_ok=True)
    monkeypatch.setattr(harness, "_precompiled", False)
    harness.precompile()
    assert all(pyc.is_file() for pyc in targets)
    # Valid for the source as it is now: the loader would use it rather than compile again.
    for module, pyc in zip(
        (dispatcher.serve.worker, coordinator.coordinator), targets, strict=True
    ):
        header = pyc.read_bytes()[:16]
        assert header[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(header[8:12], "little") == int(Path(module.__file__).stat().st_mtime)

    targets[0].unlink()
    harness.precompile()  # once per process: the second call does nothing
    assert not targets[0].exists()
    py_compile.compile(dispatcher.serve.worker.__file__)  # leave it as precompile() did
