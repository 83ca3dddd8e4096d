"""The storm filter with a fake clock: a burst per key and window passes, the rest is counted and
reported on the key's next line, or in a summary line once the key went quiet."""

import logging
import threading

import pytest

from dispatcher.observe.ratelimit import SUPPRESSED, SUPPRESSED_S, StormFilter, _shape


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(
    msg: str = "job %d failed",
    *args: object,
    name: str = "dispatcher.jobs",
    level: int = logging.WARNING,
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args or (1,), None)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(clock: Clock, **kw) -> tuple[StormFilter, list[logging.LogRecord]]:
    summaries: list[logging.LogRecord] = []
    storm = StormFilter(
        burst=kw.pop("burst", 3),
        window_s=kw.pop("window_s", 10.0),
        shapes=kw.pop("shapes", 64),
        clock=clock,
        emit=summaries.append,
    )
    return storm, summaries


def test_a_burst_passes_then_lines_are_dropped_and_counted(clock):
    storm, _ = make(clock)
    kept = [storm.filter(record("job %d failed", i)) for i in range(10)]
    assert kept == [True] * 3 + [False] * 7
    assert storm.dropped_total == 7


def test_the_next_line_after_the_window_carries_the_count(clock):
    storm, summaries = make(clock)
    for i in range(10):
        storm.filter(record("job %d failed", i))
    clock.now += 12.0
    line = record("job %d failed", 99)
    assert storm.filter(line)
    assert getattr(line, SUPPRESSED) == 7 and getattr(line, SUPPRESSED_S) == pytest.approx(12.0)
    assert summaries == []  # the count rode on the key's own line: no summary for it
    # A new window: its burst passes again, and carries no count.
    followers = [record("job %d failed", i) for i in range(2)]
    assert all(storm.filter(r) for r in followers)
    assert not any(hasattr(r, SUPPRESSED) for r in followers)


def test_within_the_window_nothing_more_passes(clock):
    storm, _ = make(clock)
    for i in range(3):
        storm.filter(record("job %d failed", i))
    clock.now += 9.9
    assert not storm.filter(record("job %d failed", 4))


def test_keys_are_logger_level_template_and_shape_not_the_ids(clock):
    storm, _ = make(clock, burst=1)
    assert storm.filter(record("job %d failed", 1))
    assert not storm.filter(record("job %d failed", 2))  # same template, other id: same key
    assert storm.filter(record("job %d failed: %s", 1, "no such user"))
    assert storm.filter(record("job %d failed: %s", 2, "disk full"))  # other words: other key
    assert storm.filter(record("job %d timed out", 3))  # other template
    assert storm.filter(record("job %d failed", 4, level=logging.ERROR))  # other level
    assert storm.filter(record("job %d failed", 5, name="coordinator"))  # other logger


def test_a_key_that_went_quiet_gets_a_summary_on_the_next_line_of_any_key(clock):
    storm, summaries = make(clock)
    for i in range(8):
        storm.filter(record("job %d failed", i))
    clock.now += 10.5
    assert storm.filter(record("something else %d", 1))  # another key: triggers the sweep
    [summary] = summaries
    assert getattr(summary, SUPPRESSED) == 5
    assert (summary.name, summary.levelno) == ("dispatcher.jobs", logging.WARNING)
    assert (
        summary.getMessage()
        == "5 similar lines suppressed in the last 10.5 s; the last one: job 7 failed"
    )
    # the handler passes it back through the filters: never counted or dropped
    assert storm.filter(summary)
    # Reported once: the key's next line carries no count.
    line = record("job %d failed", 9)
    assert storm.filter(line) and not hasattr(line, SUPPRESSED)


def test_the_sweep_runs_once_per_window_and_forgets_stale_keys(clock):
    storm, summaries = make(clock, burst=1)
    for i in range(500):  # f-string-like messages: a key per line
        storm.filter(record(f"unique {i}"))
    assert len(storm._windows) == 500
    clock.now += 10.0
    storm.filter(record("one more"))
    assert len(storm._windows) == 1 and summaries == []  # nothing was dropped: no summary


def test_drain_reports_every_count_not_yet_reported(clock):
    storm, summaries = make(clock, burst=1)
    for i in range(4):
        storm.filter(record("job %d failed", i))
        storm.filter(record("claim failed: %s", f"e{i}"))
    drained = storm.drain()
    assert sorted(getattr(r, SUPPRESSED) for r in drained) == [3, 3]
    assert storm.drain() == [] and summaries == []


def test_concurrent_threads_pass_exactly_one_burst_and_count_every_drop(clock):
    storm, _ = make(clock, burst=10)
    kept = []
    per_thread = 2000

    def hammer() -> None:
        kept.append(sum(storm.filter(record("job %d failed", i)) for i in range(per_thread)))

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(kept) == 10
    assert storm.dropped_total == 8 * per_thread - 10


def test_a_hot_loop_of_one_event_collapses_whatever_its_ids_counts_and_durations(clock):
    storm, summaries = make(clock, burst=3)
    lines = [
        record(
            "worker %s claimed %d jobs of %s in %.1f s",
            f"pod-{i:06x}",
            i % 7,
            f"550e8400-e29b-41d4-a716-{i:012x}",
            i / 10,
            name="dispatcher.claims",
            level=logging.INFO,
        )
        for i in range(1, 41)
    ]
    kept = [storm.filter(r) for r in lines]
    assert kept == [True] * 3 + [False] * 37
    clock.now += 10.0
    storm.filter(record("something else %d", 1))  # the sweep
    [summary] = summaries
    assert getattr(summary, SUPPRESSED) == 37
    assert summary.getMessage().startswith("37 similar lines suppressed")


def test_distinct_one_off_lines_of_one_template_all_pass(clock):
    """Each migration applied is its own event: more of them than a burst, in one window."""
    storm, summaries = make(clock, burst=3)
    names = ["jobs", "coordinator", "claim_index_tag", "lease_expiries", "coordinator_groups"]
    names += ["maintenance_leases", "cancel_and_retention", "ordering_keys", "flow_control"]
    lines = [
        record("applying migration %s/%04d_%s", "dispatcher.db", v, name, level=logging.INFO)
        for v, name in enumerate(names, start=1)
    ]
    assert all(storm.filter(r) for r in lines)
    assert storm.dropped_total == 0
    assert storm.drain() == [] and summaries == []


def test_a_template_of_too_many_shapes_collapses_under_the_template(clock):
    storm, summaries = make(clock, burst=2, shapes=5)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]
    kept = [storm.filter(record("claim failed: %s", w)) for w in words]
    # five shapes of their own, then the template's key: its burst, then counted
    assert kept == [True] * 5 + [True] * 2 + [False] * 2
    # a shape seen before the cap keeps its own key (and burst)
    assert [storm.filter(record("claim failed: %s", "alpha")) for _ in range(2)] == [True, False]
    assert storm.dropped_total == 3
    # a new window of the template: new shapes have keys of their own again
    clock.now += 10.0
    assert storm.filter(record("claim failed: %s", "juliett"))
    assert storm.filter(record("claim failed: %s", "kilo"))
    assert sorted(getattr(s, SUPPRESSED) for s in summaries) == [1, 2]


def test_the_shape_masks_numbers_hex_ids_and_uuids_not_words():
    line = record(
        "job %d of %s at %s (%s, %s)",
        42,
        "pod-3f9a2c",
        "2025-01-31T09:14:07.201Z",
        "550e8400-e29b-41d4-a716-446655440000",
        "deadbeef",
    )
    assert _shape(line) == "job # of pod-# at #-#-#T#:#:#.#Z (#, deadbeef)"
    assert _shape(record("applying migration %s/%04d_%s", "coordinator", 5, "groups")) == (
        "applying migration coordinator/#_groups"
    )


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        StormFilter(burst=0)
    with pytest.raises(ValueError):
        StormFilter(window_s=0)
    with pytest.raises(ValueError):
        StormFilter(shapes=0)
