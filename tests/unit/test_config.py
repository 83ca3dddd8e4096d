import pytest

from dispatcher.config import Config, parse_buckets
from dispatcher.errors import ConfigError


def test_defaults_are_valid_and_heartbeat_is_a_third_of_the_lease():
    config = Config.load({})
    assert config.mode == "partitioned"
    assert config.heartbeat_s == pytest.approx(config.lease_s / 3)


def test_env_then_flags_win():
    config = Config.load({"DISPATCHER_MODE": "skip_locked", "DISPATCHER_BATCH_SIZE": "50"}, batch_size="70")
    assert config.mode == "skip_locked"
    assert config.batch_size == 70


@pytest.mark.parametrize(
    ("env", "flags", "named"),
    [
        ({"DISPATCHER_MODE": "fast"}, {}, "DISPATCHER_MODE"),
        ({"DISPATCHER_CONCURRENCY": "lots"}, {}, "DISPATCHER_CONCURRENCY"),
        ({"DISPATCHER_CONCURRENCY": "0"}, {}, "DISPATCHER_CONCURRENCY"),
        ({}, {"lease_s": "0.5"}, "--lease-s"),
        ({"DISPATCHER_LEASE_S": "10", "DISPATCHER_HEARTBEAT_INTERVAL_S": "6"}, {}, "DISPATCHER_HEARTBEAT_INTERVAL_S"),
        ({"DISPATCHER_BUCKETS": "0-70"}, {}, "DISPATCHER_BUCKETS"),
        ({"DISPATCHER_BUCKETS": "9-3"}, {}, "DISPATCHER_BUCKETS"),
        ({"DISPATCHER_WORKER_INDEX": "4", "DISPATCHER_WORKER_COUNT": "4"}, {}, "DISPATCHER_WORKER_INDEX"),
        ({"DISPATCHER_HISTORY": "maybe"}, {}, "DISPATCHER_HISTORY"),
        ({"DISPATCHER_QUEUES": " , "}, {}, "DISPATCHER_QUEUES"),
    ],
)
def test_bad_values_name_the_setting(env, flags, named):
    with pytest.raises(ConfigError) as info:
        Config.load(env, **flags)
    assert info.value.setting == named


def test_static_buckets_worker_i_of_n_cover_all_buckets_once():
    owned = [Config.load({}, worker_index=i, worker_count=3).static_buckets for i in range(3)]
    flat = sorted(b for part in owned for b in part)
    assert flat == list(range(64))
    assert max(map(len, owned)) - min(map(len, owned)) <= 1


def test_parse_buckets():
    assert parse_buckets("0-3, 7,9-9") == (0, 1, 2, 3, 7, 9)
    assert Config.load({"DISPATCHER_BUCKETS": "5,1"}).static_buckets == (1, 5)


def test_config_is_frozen():
    config = Config.load({})
    with pytest.raises(AttributeError):
        config.mode = "skip_locked"  # type: ignore[misc]
