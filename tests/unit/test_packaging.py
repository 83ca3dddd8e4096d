"""Packaging: the version (`dispatcher.__version__`, `dispatcher --version`), help text with its
default on every CLI option, a README settings table that matches config.settings() row for row,
and what the wheel carries (py.typed, the SQL files, the LICENSE)."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import dispatcher
from dispatcher.cli.commands import build_parser
from dispatcher.settings.config import settings

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_the_distributions() -> None:
    # pyproject.toml reads the version from dispatcher/_version.py; the installed metadata agrees.
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert dispatcher.__version__ == metadata.version("bucket-dispatcher")
    assert re.fullmatch(r"\d+\.\d+\.\d+", dispatcher.__version__)


def test_cli_prints_the_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"dispatcher {dispatcher.__version__}"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_option_has_help_with_its_default(command: str) -> None:
    """Every argument says what it does; every option whose default means something says it."""
    parser = _subcommands()[command]
    for action in parser._actions:
        if isinstance(
            action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
        ):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"dispatcher {command} {name}: no help text"
        flag_only = isinstance(action, argparse._StoreTrueAction)
        if action.option_strings and not flag_only and not action.required:
            # as argparse renders it
            text = action.help % {"default": action.default, "prog": parser.prog}
            assert "default" in text, (
                f"dispatcher {command} {name}: the help does not give the default"
            )


def test_help_renders_for_every_subcommand() -> None:
    for command, parser in _subcommands().items():
        text = parser.format_help()  # raises on a bad %-format in any help
        assert text.startswith("usage: dispatcher"), command


_ROW = re.compile(r"^\| `(DISPATCHER_[A-Z0-9_]+)` \| (.+?) \| (.+) \|$")


def readme_settings() -> dict[str, str]:
    """env var -> default column, from the configuration reference's tables (generated; was the
    README's)."""
    section = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    rows = {}
    for line in section.splitlines():
        m = _ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows"
            rows[m.group(1)] = m.group(2).replace("`", "").strip()
    return rows


def test_readme_settings_table_lists_every_setting_and_only_settings() -> None:
    rows = readme_settings()
    env_vars = {s.env_var for s in settings()}
    assert not env_vars - set(rows), (
        f"settings missing from the README table: {sorted(env_vars - set(rows))}"
    )
    assert not set(rows) - env_vars, (
        f"README rows that are no setting: {sorted(set(rows) - env_vars)}"
    )
    for s in settings():
        assert rows[s.env_var] == s.default_text, (
            f"{s.env_var}: README says {rows[s.env_var]!r}, the code {s.default_text!r}"
        )


def test_pyproject_metadata() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert (
        "Apache License" in (ROOT / "LICENSE").read_text()
        and "Version 2.0" in (ROOT / "LICENSE").read_text()
    )
    assert "Typing :: Typed" in project["classifiers"]
    assert not any(c.startswith("License ::") for c in project["classifiers"]), (
        "an SPDX license expression excludes License :: classifiers (PEP 639)"
    )
    python_versions = {
        c.rsplit(" ", 1)[-1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert "3.11" in python_versions and project["requires-python"] == ">=3.11"
    assert project["keywords"]


@pytest.mark.slow
def test_the_wheel_carries_type_markers_sql_the_dashboards_files_and_license(
    tmp_path: Path,
) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for package in ("dispatcher", "coordinator"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0 and "No module named pip" in done.stderr:
        pytest.skip("pip is not installed in this interpreter")
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("bucket_dispatcher-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "dispatcher/py.typed",
        "coordinator/py.typed",
        "dispatcher/db/sql/claim.sql",
        "dispatcher/devtools/sql/measure.sql",
        "dispatcher/db/sql/web.sql",
    } <= names
    # The dashboard's templates and assets: all it serves comes from the package (no CDN).
    web = ROOT / "dispatcher" / "web"
    assert {
        str(f.relative_to(ROOT)) for f in [*web.glob("templates/*"), *web.glob("static/*")]
    } <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(
        n for n in names if "dist-info" in n
    )
    assert not any(n.startswith(("tests/", "bench/", "k8s/")) for n in names)
