import dataclasses
import re
from pathlib import Path

import pytest

from dispatcher.errors import ConfigError, EnqueueError
from dispatcher.settings.config import Config, parse_buckets, settings


def test_defaults_are_valid_and_heartbeat_is_a_third_of_the_lease():
    config = Config.load({})
    assert config.mode == "partitioned"
    assert config.leases.heartbeat_s == pytest.approx(config.lease_s / 3)


def test_env_then_flags_win():
    config = Config.load(
        {"DISPATCHER_MODE": "skip_locked", "DISPATCHER_BATCH_SIZE": "50"}, batch_size="70"
    )
    assert config.mode == "skip_locked"
    assert config.batch_size == 70


@pytest.mark.parametrize(
    ("env", "flags", "named"),
    [
        ({"DISPATCHER_MODE": "fast"}, {}, "DISPATCHER_MODE"),
        ({"DISPATCHER_CONCURRENCY": "lots"}, {}, "DISPATCHER_CONCURRENCY"),
        ({"DISPATCHER_CONCURRENCY": "0"}, {}, "DISPATCHER_CONCURRENCY"),
        ({}, {"lease_s": "0.5"}, "--lease-s"),
        (
            {"DISPATCHER_LEASE_S": "10", "DISPATCHER_HEARTBEAT_INTERVAL_S": "6"},
            {},
            "DISPATCHER_HEARTBEAT_INTERVAL_S",
        ),
        ({"DISPATCHER_BUCKETS": "0-70"}, {}, "DISPATCHER_BUCKETS"),
        ({"DISPATCHER_BUCKETS": "9-3"}, {}, "DISPATCHER_BUCKETS"),
        (
            {"DISPATCHER_WORKER_INDEX": "4", "DISPATCHER_WORKER_COUNT": "4"},
            {},
            "DISPATCHER_WORKER_INDEX",
        ),
        ({"DISPATCHER_HISTORY": "maybe"}, {}, "DISPATCHER_HISTORY"),
        ({"DISPATCHER_QUEUES": " , "}, {}, "DISPATCHER_QUEUES"),
        ({"DISPATCHER_QUEUES": "we ird"}, {}, "DISPATCHER_QUEUES"),  # enqueue refuses that name
        ({"DISPATCHER_QUEUES": "emails,a/b"}, {}, "DISPATCHER_QUEUES"),
        ({}, {"queues": "emails," + "x" * 101}, "--queues"),  # a name over 100 characters
        # Only the static coordinator reads DISPATCHER_BUCKETS: elsewhere it was silently ignored.
        ({"DISPATCHER_BUCKETS": "0-15"}, {}, "DISPATCHER_BUCKETS"),
        (
            {
                "DISPATCHER_BUCKETS": "0-15",
                "DISPATCHER_COORDINATOR": "redis",
                "DISPATCHER_REDIS_URL": "redis://r",
            },
            {},
            "DISPATCHER_BUCKETS",
        ),
        ({"DISPATCHER_COORDINATOR": "static"}, {"buckets": ","}, "--buckets"),  # no bucket at all
        ({"DISPATCHER_DSN": "postgresql://u:s3cr%t@db/jobs"}, {}, "DISPATCHER_DSN"),
        ({}, {"dsn": "not a dsn"}, "--dsn"),
    ],
)
def test_bad_values_name_the_setting(env, flags, named):
    with pytest.raises(ConfigError) as info:
        Config.load(env, **flags)
    assert info.value.setting == named


def test_listen_goes_to_the_dsn_unless_told_otherwise_or_off():
    pooled = Config(dsn="postgresql://pooled")
    assert pooled.worker.listen_dsn == pooled.coordination.listen_dsn == "postgresql://pooled"
    direct = Config.load(
        {"DISPATCHER_DSN": "postgresql://pooled", "DISPATCHER_LISTEN_DSN": "postgresql://direct"}
    )
    assert direct.worker.listen_dsn == direct.coordination.listen_dsn == "postgresql://direct"
    for off in ("none", "NONE", " None "):
        config = Config.load({"DISPATCHER_DSN": "postgresql://pooled"}, listen_dsn=off)
        assert config.worker.listen_dsn is None and config.coordination.listen_dsn is None


def test_prepared_statements_reach_the_connection_limits():
    assert Config().database.limits.prepared_statements is True
    off = Config.load({"DISPATCHER_PREPARED_STATEMENTS": "false"})
    assert off.database.limits.prepared_statements is False
    assert off.coordination.limits.prepared_statements is False
    assert (off.database.limits.connect_timeout_s, off.database.limits.statement_timeout_s) == (
        5,
        5,
    )


def test_the_queue_rule_is_enqueues_rule():
    """One rule for both: a queue a worker accepts is one a job can be enqueued to, and back."""
    from dispatcher.api.enqueue_checks import check_names

    for name in [
        "default",
        "a.b-c_9",
        "x" * 100,
        "x" * 101,
        "we ird",
        "q\n",
        "a:b",
        "é",
        "",
        "a\tb",
    ]:
        try:
            check_names(name, "job")
            enqueue_accepts = True
        except EnqueueError:
            enqueue_accepts = False
        try:
            Config(queues=(name,))
            config_accepts = True
        except ConfigError:
            config_accepts = False
        assert config_accepts == enqueue_accepts, name
    assert Config(queues=("default", "a.b-c_9")).queues == ("default", "a.b-c_9")


def test_a_bad_dsn_is_named_without_its_password():
    with pytest.raises(ConfigError) as info:
        Config.load({"DISPATCHER_DSN": "postgresql://app:s3cr%t@db/jobs"})
    assert "percent-encoded" in str(info.value) and "s3cr" not in str(info.value)


def test_static_buckets_worker_i_of_n_cover_all_buckets_once():
    owned = [
        Config.load({}, worker_index=i, worker_count=3).coordination.static_buckets
        for i in range(3)
    ]
    flat = sorted(b for part in owned for b in part)
    assert flat == list(range(64))
    assert max(map(len, owned)) - min(map(len, owned)) <= 1


def test_parse_buckets():
    assert parse_buckets("0-3, 7,9-9") == (0, 1, 2, 3, 7, 9)
    config = Config.load({"DISPATCHER_BUCKETS": "5,1", "DISPATCHER_COORDINATOR": "static"})
    assert config.coordination.static_buckets == (1, 5)


def test_config_is_frozen():
    config = Config.load({})
    with pytest.raises(AttributeError):
        config.mode = "skip_locked"  # type: ignore[misc]


# -- validation at construction: no Config exists with a bad value ------------------------------

BAD_FIELD_VALUES = [
    ("mode", {"mode": "fast"}),
    ("queues", {"queues": ()}),
    ("queues", {"queues": ("a", "")}),
    ("concurrency", {"concurrency": 0}),
    ("concurrency", {"concurrency": "5"}),
    ("batch_size", {"batch_size": 10_001}),
    ("lease_s", {"lease_s": 0}),
    ("lease_s", {"lease_s": "30"}),
    ("heartbeat_interval_s", {"lease_s": 10, "heartbeat_interval_s": 6}),
    ("retry_cap_s", {"retry_base_s": 10, "retry_cap_s": 5}),
    ("flush_interval_s", {"flush_interval_s": 6}),
    ("redis_url", {"coordinator": "redis"}),
    ("coordinator_poll_s", {"coordinator_lease_s": 3, "coordinator_poll_s": 2}),
    ("buckets", {"coordinator": "static", "buckets": (0, 64)}),
    ("buckets", {"coordinator": "static", "buckets": ()}),
    ("buckets", {"buckets": (0, 1)}),  # without the static coordinator
    ("queues", {"queues": ("emails", "we ird")}),
    ("queues", {"queues": ("q\n",)}),
    ("dsn", {"dsn": "postgresql://u:s3cr%t@db/jobs"}),
    ("worker_index", {"worker_index": 4, "worker_count": 4}),
    ("metrics_port", {"metrics_port": 70_000}),
    ("log_level", {"log_level": "LOUD"}),
    ("log_format", {"log_format": "xml"}),
    ("redis_url", {"coordinator": "redis", "redis_url": "redis://:pw@cache:notaport/0"}),
    ("steal", {"steal": "yes"}),
    ("listen_dsn", {"listen_dsn": " "}),
    ("prepared_statements", {"prepared_statements": "false"}),
    ("worker_id", {"worker_id": None}),
    ("completed_retention_s", {"completed_retention_s": -1}),
    ("failed_retention_s", {"failed_retention_s": -0.5}),
    ("history_retention_s", {"history_retention_s": float("nan")}),
    ("prune_batch", {"prune_batch": 0}),
    ("prune_batch", {"prune_batch": 10_001}),
    ("app", {"app": "myapp.jobs"}),
    ("app", {"app": ":registry"}),
]


def test_retention_settings_default_to_a_week_for_failures_and_history_and_0_keeps_forever():
    config = Config.load({"DISPATCHER_FAILED_RETENTION_S": "0", "DISPATCHER_PRUNE_BATCH": "250"})
    assert (
        config.completed_retention_s,
        config.failed_retention_s,
        config.history_retention_s,
    ) == (3600, 0, 604800)
    assert config.prune_batch == 250
    with pytest.raises(ConfigError) as info:
        Config.load({"DISPATCHER_HISTORY_RETENTION_S": "-1"})
    assert info.value.setting == "DISPATCHER_HISTORY_RETENTION_S"


@pytest.mark.parametrize(("field", "values"), BAD_FIELD_VALUES)
def test_direct_construction_rejects_bad_values_naming_the_field(field, values):
    with pytest.raises(ConfigError) as info:
        Config(**values)
    assert info.value.setting == field


@pytest.mark.parametrize(("field", "values"), BAD_FIELD_VALUES)
def test_replace_rejects_bad_values_naming_the_field(field, values):
    base = Config(lease_s=60)
    with pytest.raises(ConfigError) as info:
        base.replace(**values)
    assert info.value.setting == field
    assert base.lease_s == 60  # the original is untouched


def test_replace_returns_a_valid_copy():
    base = Config(dsn="postgresql://x")
    new = base.replace(lease_s=12, heartbeat_interval_s=None)
    assert (new.lease_s, new.leases.heartbeat_s, new.dsn, new.worker_id) == (
        12,
        4,
        "postgresql://x",
        base.worker_id,
    )
    assert (
        new.claims.lease_s,
        new.database.limits.statement_timeout_s,
        base.leases.heartbeat_s,
    ) == (12, 5, 10)
    assert base.lease_s == 30


def test_private_exception_and_parser_table_are_gone():
    # The old private exception is gone: every rule raises the public ConfigError.
    import dispatcher.settings.config as config_module

    assert not hasattr(config_module, "_Invalid")
    assert not hasattr(config_module, "_PARSERS")


@pytest.mark.parametrize(
    ("field", "env", "flag", "bad"),
    [
        ("lease_s", "DISPATCHER_LEASE_S", "--lease-s", "0"),
        ("mode", "DISPATCHER_MODE", "--mode", "sideways"),
        ("batch_size", "DISPATCHER_BATCH_SIZE", "--batch-size", "0"),
        ("concurrency", "DISPATCHER_CONCURRENCY", "--concurrency", "lots"),  # unparsable
    ],
)
def test_load_names_the_env_var_or_the_flag_the_bad_value_came_from(field, env, flag, bad):
    with pytest.raises(ConfigError) as info:
        Config.load({env: bad})
    assert info.value.setting == env
    with pytest.raises(ConfigError) as info:
        Config.load({}, **{field: bad})
    assert info.value.setting == flag
    # A good env var with a bad flag: the flag is what the user has to fix.
    with pytest.raises(ConfigError) as info:
        Config.load({env: str(getattr(Config(), field))}, **{field: bad})
    assert info.value.setting == flag
    # A bad env var overridden by a good flag is fine.
    assert getattr(
        Config.load({env: bad}, **{field: str(getattr(Config(), field))}), field
    ) == getattr(Config(), field)


def test_load_keeps_the_rule_message_and_rejects_unknown_flags():
    with pytest.raises(ConfigError) as info:
        Config.load({"DISPATCHER_LEASE_S": "0.5"})
    assert str(info.value) == "DISPATCHER_LEASE_S: must be >= 1 second"
    with pytest.raises(ConfigError) as info:
        Config.load({}, lease_seconds="5")
    assert info.value.setting == "--lease-seconds"


FLOAT_SETTINGS = [s for s in settings() if s.parse is float]


def test_there_are_float_settings():
    names = {s.name for s in FLOAT_SETTINGS}
    assert {"lease_s", "heartbeat_interval_s", "flush_interval_s", "coordinator_poll_s"} <= names


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "Infinity"])
@pytest.mark.parametrize("s", FLOAT_SETTINGS, ids=lambda s: s.name)
def test_non_finite_floats_are_rejected_for_every_float_setting(s, text):
    with pytest.raises(ConfigError) as info:
        Config(**{s.name: float(text)})
    assert info.value.setting == s.name
    with pytest.raises(ConfigError) as info:
        Config.load({s.env_var: text})
    assert info.value.setting == s.env_var
    assert "finite" in str(info.value)
    with pytest.raises(ConfigError) as info:
        Config.load({}, **{s.name: text})
    assert info.value.setting == s.flag


# -- field metadata: parser, help, unit, default -------------------------------------------------


def test_every_field_is_a_setting_with_help_and_a_parser():
    names = [f.name for f in dataclasses.fields(Config) if f.init]  # the others are its sections
    assert [s.name for s in settings()] == names
    for s in settings():
        assert s.env_var == "DISPATCHER_" + s.name.upper()
        assert s.flag == "--" + s.name.replace("_", "-")
        assert callable(s.parse), s.name
        assert len(s.help) >= 15 and "(default" not in s.help, s.name
        assert s.description == f"{s.help} (default {s.default_text})"
        assert s.default_text, s.name
        if s.unit is not None:
            assert s.unit in s.help, f"{s.name}: help should say its unit ({s.unit})"
        if s.name.endswith("_s"):
            assert s.unit == "seconds", s.name
        if s.name.endswith("_bytes"):
            assert s.unit == "bytes", s.name


def test_each_parser_reads_back_its_own_default():
    config = Config()
    for s in settings():
        default = getattr(config, s.name)
        if default is None or s.name == "worker_id":
            continue
        if isinstance(default, tuple):
            text = ",".join(map(str, default))
        else:
            text = str(default).lower() if isinstance(default, bool) else str(default)
        assert s.parse(text) == default, s.name
        assert getattr(Config.load({s.env_var: text}), s.name) == default


def test_documented_defaults_match_the_dataclass():
    config = Config()
    for s in settings():
        if s.name in (
            "worker_id",
            "heartbeat_interval_s",
            "statement_timeout_s",
            "buckets",
            "max_payload_bytes",
            "listen_dsn",
        ):
            continue  # computed or described defaults
        assert s.default == getattr(config, s.name), s.name
        shown = s.default_text
        expected = getattr(config, s.name)
        if expected is None:
            assert shown == "none", s.name
        else:
            assert s.parse(shown.lower() if isinstance(expected, bool) else shown) == expected, (
                s.name
            )
    assert settings()[
        [s.name for s in settings()].index("max_payload_bytes")
    ].default_text.startswith("1048576")


def WORKER_SETTINGS():
    return tuple(s for s in settings() if s.section != "web")


def test_run_help_lists_every_setting_with_its_help(capsys, monkeypatch):
    from dispatcher.cli.commands import build_parser

    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["run", "--help"])
    assert info.value.code == 0
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines (also at hyphens)
    for s in WORKER_SETTINGS():
        value = "[V]" if isinstance(s.default, bool) else "V"  # a bare boolean flag means true
        assert "".join(f"{s.flag} {value} {s.description}".split()) in out, s.flag
    assert "(default30)" in out and "(defaultNone)" not in out


def _help(*command: str, capsys: pytest.CaptureFixture[str]) -> str:
    from dispatcher.cli.commands import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*command, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


WORKER_ONLY = (
    "--steal",
    "--flush-max",
    "--coordinator-lease-s",
    "--queues",
    "--lease-s",
    "--app",
    "--metrics-port",
)


@pytest.mark.parametrize(
    "command",
    [
        ["enqueue"],
        ["status"],
        ["migrate"],
        ["grants"],
        ["jobs", "list"],
        ["jobs", "retry"],
        ["demo"],
    ],
    ids=" ".join,
)
def test_a_one_shot_commands_help_lists_only_the_settings_it_reads(command, capsys):
    text = _help(*command, capsys=capsys)
    assert "--dsn" in text and "--log-level" in text and "--log-format" in text
    for flag in WORKER_ONLY:
        assert flag not in text.split(), f"dispatcher {' '.join(command)} --help lists {flag}"
    assert ("--max-payload-bytes" in text) == (command == ["enqueue"])  # enqueue's own limit


def test_run_help_lists_every_setting_and_a_one_shot_command_parses_no_worker_flag(capsys):
    from dispatcher.cli.commands import build_parser

    text = _help("run", capsys=capsys)
    assert all(s.flag in text.split() for s in WORKER_SETTINGS())
    assert not any(s.flag in text.split() for s in settings("web")), (
        "the dashboard's settings are `web`'s own"
    )
    web = _help("web", capsys=capsys)
    assert all(
        flag in web.split()
        for flag in ("--host", "--port", "--allow-actions", "--insecure", "--dsn")
    )
    assert "--web-token" not in web and "--app" not in web.split(), (
        "the token comes from the environment only"
    )
    assert "--web-session-secret" not in web, "the session secret too"
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["enqueue", "hello", "--steal", "false"])
    assert info.value.code == 2 and "unrecognized arguments: --steal" in capsys.readouterr().err


def test_every_setting_names_its_section_and_each_section_has_settings():
    from dispatcher.settings.sections import SECTIONS

    assert {s.section for s in settings()} == set(SECTIONS)
    assert [s.name for s in settings("leases")] == ["lease_s", "heartbeat_interval_s"]
    assert [s.name for s in settings("database", "logging")] == [
        "dsn",
        "connect_timeout_s",
        "statement_timeout_s",
        "prepared_statements",
        "log_level",
        "log_format",
    ]
    with pytest.raises(TypeError, match="unknown section"):
        from dispatcher.settings.meta import setting

        setting(1, section="nowhere", parse=int, help="a setting of no component")


def test_a_token_needs_a_session_secret_of_enough_length_kept_out_of_sight():
    token, secret = "a-token-of-enough-length", "s" * 31 + "!"
    with pytest.raises(ConfigError) as info:
        Config.load({"DISPATCHER_WEB_TOKEN": token})
    assert info.value.setting == "DISPATCHER_WEB_SESSION_SECRET"
    assert "DISPATCHER_WEB_TOKEN" in info.value.message
    assert "secrets.token_urlsafe(32)" in info.value.message
    for short in ("x" * 31, "  " + "x" * 31 + "  "):
        with pytest.raises(ConfigError) as info:
            Config.load({"DISPATCHER_WEB_SESSION_SECRET": short})
        assert info.value.setting == "DISPATCHER_WEB_SESSION_SECRET"
        assert "at least 32 characters" in info.value.message
    with pytest.raises(ConfigError, match="must not be the token"):
        Config(web_token="t" * 32, web_session_secret="t" * 32)
    config = Config.load({"DISPATCHER_WEB_TOKEN": token, "DISPATCHER_WEB_SESSION_SECRET": secret})
    assert (config.web.token, config.web.session_secret) == (token, secret)
    assert secret not in repr(config) and secret not in repr(config.web)
    # without a token a secret is optional (the CSRF key is then one of the process)
    assert Config.load({}).web.session_secret is None


def test_a_command_never_writes_the_token_or_the_session_secret(monkeypatch):
    from dispatcher.cli.commands import _config_from, build_parser
    from dispatcher.observe import logs

    token, secret = "a-token-never-in-a-log-line", "a-session-secret-never-in-a-log-line-0123"
    monkeypatch.setenv("DISPATCHER_WEB_TOKEN", token)
    monkeypatch.setenv("DISPATCHER_WEB_SESSION_SECRET", secret)
    _config_from(build_parser().parse_args(["status"]))
    line = logs.redact(f"token {token}, secret {secret}")
    assert token not in line and secret not in line, line


def test_each_section_holds_its_settings_with_the_derived_values_resolved():
    config = Config.load(
        {
            "DISPATCHER_LEASE_S": "12",
            "DISPATCHER_COORDINATOR_LEASE_S": "6",
            "DISPATCHER_FAILED_RETENTION_S": "0",
            "DISPATCHER_LOG_LEVEL": "debug",
            "DISPATCHER_DSN": "postgresql://db/app",
            "DISPATCHER_APP": "myapp.jobs:registry",
        }
    )
    assert (config.leases.lease_s, config.leases.heartbeat_s) == (12, 4)
    assert (config.leases.start_margin_s, config.leases.lose_early_s) == (2, 0.5)
    assert config.database.limits.statement_timeout_s == 5  # min(5, lease / 2)
    assert config.coordination.limits.statement_timeout_s == 2  # a third of the membership lease
    assert config.claims.lease_s == 12 and config.claims.partitioned
    assert dict(config.retention.retentions_s) == {
        "completed": 3600,
        "failed": 0,
        "history": 604800,
    }
    assert (
        config.worker.app == "myapp.jobs:registry"
        and config.worker.listen_dsn == "postgresql://db/app"
    )
    assert config.logging.level == "DEBUG" and config.coordination.used
    assert (
        not Config(mode="skip_locked").coordination.used
        and not Config(coordinator="static").coordination.used
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.claims.batch_size = 1  # type: ignore[misc]


# -- README ---------------------------------------------------------------------------------------

# generated; was README.md
README = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"


def settings_table(text: str) -> list[list[str]]:
    """The rows (cells, backticks stripped) of the `| setting | default | meaning |` tables (one
    per section)."""
    lines = text.splitlines()
    header = re.compile(r"\|\s*setting\s*\|\s*default\s*\|\s*meaning\s*\|")
    starts = [i for i, line in enumerate(lines) if header.fullmatch(line.strip())]
    assert starts, "no settings table"
    rows = []
    for start in starts:
        for line in lines[start + 2 :]:
            if not line.strip().startswith("|"):
                break
            rows.append(
                [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
            )
    return rows


def check_readme_table(text: str) -> None:
    rows = settings_table(text)
    by_var = {s.env_var: s for s in settings()}
    listed = [row[0] for row in rows]
    assert sorted(listed) == sorted(by_var), (
        f"missing from README: {sorted(set(by_var) - set(listed))}; unknown or repeated there: "
        f"{sorted(v for v in listed if v not in by_var or listed.count(v) > 1)}"
    )
    mentioned = set(re.findall(r"DISPATCHER_[A-Z0-9_]+", "\n".join("|".join(row) for row in rows)))
    assert mentioned <= set(by_var), (
        f"unknown settings in the README table: {sorted(mentioned - set(by_var))}"
    )
    for var, default, meaning in rows:
        documented = by_var[var].default_text
        assert default == documented, f"{var}: README default {default!r}, code {documented!r}"
        assert meaning, var


def test_readme_settings_table_lists_every_setting_and_no_other():
    check_readme_table(README.read_text(encoding="utf-8"))


def test_readme_check_catches_a_missing_an_unknown_and_a_wrong_default():
    text = README.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `DISPATCHER_SYNC_THREADS`"))
    for broken in (
        text.replace(row + "\n", ""),
        text.replace(row, row + "\n| `DISPATCHER_TURBO` | false | go faster |"),
        text.replace(row, row.replace("| 8 |", "| 9 |")),
    ):
        with pytest.raises(AssertionError):
            check_readme_table(broken)
