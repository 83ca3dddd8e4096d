"""DISPATCHER_REDIS_KEY_PREFIX: the first part of every Redis key and channel of the Redis
coordinator, so deployments sharing one Redis database keep apart (issue 28). The two fleets on
one Redis: tests/integration/test_redis_key_prefix.py."""

import pytest

from coordinator.backend_redis import RedisBackend, RedisKeys
from dispatcher.errors import ConfigError
from dispatcher.serve.coordination import build_assignments, redis_prefix
from dispatcher.settings.config import Config, settings

REDIS = {"coordinator": "redis", "redis_url": "redis://127.0.0.1:6379/0"}


def names(keys: RedisKeys) -> tuple[str, ...]:
    return keys.members, keys.leader, keys.buckets, keys.channel, keys.member("w1")


def test_the_default_keeps_todays_key_names():
    config = Config(**REDIS)
    assert config.redis_key_prefix == config.coordination.redis_key_prefix == "dispatcher"
    assert (
        redis_prefix("emails")
        == redis_prefix("emails", config.redis_key_prefix)
        == "dispatcher:emails"
    )
    assert names(RedisKeys(redis_prefix("default"))) == (
        "dispatcher:default:members",
        "dispatcher:default:leader",
        "dispatcher:default:buckets",
        "dispatcher:default:changes",
        "dispatcher:default:member:w1",
    )


def test_a_custom_prefix_starts_every_key_and_the_channel():
    config = Config.load(
        {
            **{f"DISPATCHER_{k.upper()}": v for k, v in REDIS.items()},
            "DISPATCHER_REDIS_KEY_PREFIX": " team-a:jobs ",
        },
        queues="default,emails",
    )
    # env text is stripped, as for every setting
    assert config.coordination.redis_key_prefix == "team-a:jobs"
    groups = build_assignments(config.coordination)
    backends = {queue: group.backend for queue, group in groups.items()}  # type: ignore[attr-defined]
    assert all(isinstance(b, RedisBackend) for b in backends.values())
    assert names(backends["emails"].keys) == (
        "team-a:jobs:emails:members",
        "team-a:jobs:emails:leader",
        "team-a:jobs:emails:buckets",
        "team-a:jobs:emails:changes",
        "team-a:jobs:emails:member:w1",
    )
    assert backends["default"].keys.prefix == "team-a:jobs:default"


def test_the_flag_wins_over_the_env_var():
    config = Config.load({"DISPATCHER_REDIS_KEY_PREFIX": "from-env"}, redis_key_prefix="from-flag")
    assert config.coordination.redis_key_prefix == "from-flag"


BAD = ["", " ", "team a", "team\ta", "a\n", "{team-a}", "team-{a}", "team}"]


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_prefix_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError) as info:
        Config(redis_key_prefix=bad)
    assert info.value.setting == "redis_key_prefix"
    assert "whitespace or braces" in info.value.message


# Env text is stripped first (blank means unset): only what is still bad after that.
@pytest.mark.parametrize("bad", ["team a", "team\ta", "{team-a}", "team-{a}", "team}"])
def test_a_bad_prefix_names_the_env_var_or_the_flag(bad):
    with pytest.raises(ConfigError) as env:
        Config.load({"DISPATCHER_REDIS_KEY_PREFIX": bad})
    assert env.value.setting == "DISPATCHER_REDIS_KEY_PREFIX"
    with pytest.raises(ConfigError) as flag:
        Config.load({}, redis_key_prefix=bad)
    assert flag.value.setting == "--redis-key-prefix"


def test_blank_env_text_leaves_the_default():
    assert Config.load({"DISPATCHER_REDIS_KEY_PREFIX": "  "}).redis_key_prefix == "dispatcher"


def test_the_prefix_is_checked_whatever_the_coordinator():
    """Like redis_url: a bad value is refused even where it is not read yet, not met later."""
    for coordinator in ("postgres", "static"):
        with pytest.raises(ConfigError):
            Config(coordinator=coordinator, redis_key_prefix="a b")


def test_its_help_says_what_it_is_for():
    [s] = [s for s in settings("coordination") if s.name == "redis_key_prefix"]
    assert (s.env_var, s.flag, s.default_text) == (
        "DISPATCHER_REDIS_KEY_PREFIX",
        "--redis-key-prefix",
        "dispatcher",
    )
    assert "share one Redis database" in s.help and "<prefix>:<queue>:" in s.help
