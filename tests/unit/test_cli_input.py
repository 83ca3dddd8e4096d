"""The CLI's input, without a server: a bad invocation of any command is one line on stderr and
exit 2 (no usage block), a command group without a subcommand lists, --payload reads a file or
standard input, and --app says what is wrong with the module or attribute it names."""

import io
import sys

import orjson
import pytest

from dispatcher.cli.commands import load_registry, main, with_default_subcommand
from dispatcher.cli.enqueue import read_payload
from dispatcher.errors import ConfigError


@pytest.mark.parametrize(
    "argv, prog, says",
    [
        (["enqueue", "hello", "--delay-s", "abc"], "dispatcher enqueue", "--delay-s"),
        (["enqueue", "hello", "--count", "many"], "dispatcher enqueue", "--count"),
        (["enqueue", "hello", "--priority"], "dispatcher enqueue", "--priority"),
        (["enqueue"], "dispatcher enqueue", "job_type"),
        (["status", "--no-such-flag"], "dispatcher", "--no-such-flag"),
        (["jobs", "lst"], "dispatcher jobs", "invalid choice: 'lst'"),
        (["limits", "set", "sms", "--max-running", "x"], "dispatcher limits set", "--max-running"),
        (["queues", "pause"], "dispatcher queues pause", "queue"),
        (["schedules", "list", "--json", "x"], "dispatcher", "unrecognized arguments: x"),
        (["demo", "--jobs", "1e3"], "dispatcher demo", "--jobs"),
        ([], "dispatcher", "command"),
        (["nope"], "dispatcher", "invalid choice: 'nope'"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_bad_invocation_is_one_line_and_exit_2_without_the_usage(argv, prog, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{prog}: error: ") and says in lines[0], lines[0]
    assert "usage:" not in captured.err and captured.out == ""


def test_help_still_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["enqueue", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: dispatcher enqueue")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["limits"], ["limits", "list"]),
        (["queues"], ["queues", "list"]),
        (["schedules"], ["schedules", "list"]),
        (["jobs"], ["jobs", "list"]),
        (["limits", "--json", "--dsn", "x"], ["limits", "list", "--json", "--dsn", "x"]),
        (["jobs", "--status", "failed"], ["jobs", "list", "--status", "failed"]),
        # a subcommand given, help asked for, or another command: as typed
        (["limits", "set", "sms"], ["limits", "set", "sms"]),
        (["queues", "pause", "mail"], ["queues", "pause", "mail"]),
        (["limits", "--help"], ["limits", "--help"]),
        (["limits", "-h"], ["limits", "-h"]),
        (["jobs", "lst"], ["jobs", "lst"]),
        (["status"], ["status"]),
        ([], []),
    ],
)
def test_a_command_group_without_a_subcommand_lists(argv, expected):
    assert with_default_subcommand(argv) == expected


def test_limits_and_queues_without_a_subcommand_reach_the_list_command(capsys, monkeypatch):
    # No DSN: the list command itself runs, and says so in its own one line (exit 2).
    monkeypatch.delenv("DISPATCHER_DSN", raising=False)
    for group in ("limits", "queues", "schedules", "jobs"):
        assert main([group]) == 2
        err = capsys.readouterr().err
        assert err.splitlines() == [
            "dispatcher: invalid setting DISPATCHER_DSN: is not set (or pass --dsn)"
        ], err


# -- --payload -------------------------------------------------------------------------------------


def test_a_payload_is_inline_json_a_file_or_standard_input(tmp_path, monkeypatch):
    assert read_payload(None) is None
    assert read_payload('{"a": [1, 2]}') == {"a": [1, 2]}
    path = tmp_path / "payload.json"
    path.write_text('{"from": "file", "n": 7}\n')
    assert read_payload(f"@{path}") == {"from": "file", "n": 7}
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'["from stdin"]')))
    assert read_payload("-") == ["from stdin"]


@pytest.mark.parametrize(
    "given, content, says",
    [
        ("{not json", None, "not valid JSON: "),
        ("@{path}", b"{\n  'single': quotes\n}\n", "not valid JSON (from "),
        ("@{path}", b"", "not valid JSON (from "),
        ("@{missing}", None, "cannot read "),
        ("@", None, "@ needs a file name"),
        ("-", b"nope", "not valid JSON (from standard input)"),
    ],
)
def test_a_bad_payload_is_one_line_naming_the_flag(given, content, says, tmp_path, monkeypatch):
    path, missing = tmp_path / "payload.json", tmp_path / "absent.json"
    if content is not None:
        path.write_bytes(content)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(content)))
    with pytest.raises(ConfigError) as info:
        read_payload(given.replace("{path}", str(path)).replace("{missing}", str(missing)))
    text = str(info.value)
    assert text.startswith("--payload: ") and says in text and "\n" not in text, text


def test_a_bad_payload_file_exits_2_in_one_line(tmp_path, capsys):
    path = tmp_path / "payload.json"
    path.write_bytes(orjson.dumps({"a": 1})[:-1])  # cut short
    assert main(["enqueue", "hello", "--payload", f"@{path}", "--dsn", "postgresql://x@h/db"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("dispatcher: invalid setting --payload: not valid JSON (from ")


# -- --app -----------------------------------------------------------------------------------------


@pytest.fixture
def app_module(tmp_path, monkeypatch):
    """A package `appmod_cli` in tmp_path (on sys.path): `registry` is a Registry, `other` not."""
    (tmp_path / "appmod_cli.py").write_text(
        "import dispatcher\nregistry = dispatcher.Registry()\nother = None\n"
    )
    (tmp_path / "appmod_broken.py").write_text("import not_installed_anywhere_xyz\n")
    (tmp_path / "appmod_raises.py").write_text("raise RuntimeError('no\\nsettings')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("appmod_cli", "appmod_broken", "appmod_raises"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "spec, says",
    [
        ("appmod_cli:missing", "module 'appmod_cli' has no attribute 'missing'"),
        ("appmod_cli:other", "'appmod_cli:other' is a NoneType, not a dispatcher.Registry"),
        ("appmod_nowhere:registry", "no module named 'appmod_nowhere'"),
        (
            "appmod_broken:registry",
            "module 'appmod_broken' does not import: it needs module "
            "'not_installed_anywhere_xyz', which is not installed",
        ),
        (
            "appmod_raises:registry",
            "module 'appmod_raises' does not import: RuntimeError: no settings",
        ),
        ("appmod_cli", "expected 'module:attribute'"),
    ],
)
def test_app_errors_say_what_is_wrong(app_module, spec, says):
    with pytest.raises(ConfigError) as info:
        load_registry(spec)
    text = str(info.value)
    assert text.startswith("--app: ") and says in text and "\n" not in text, text


def test_app_that_names_a_registry_loads(app_module):
    import dispatcher

    assert isinstance(load_registry("appmod_cli:registry"), dispatcher.Registry)
