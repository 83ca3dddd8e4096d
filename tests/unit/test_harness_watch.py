"""How often the bench's watch counts the completed jobs (a table scan): rarely mid-run, often near
the end, so it neither taxes the fleet it measures nor notices the end late."""

from dispatcher.devtools.harness import COUNT_EVERY_MAX_S, next_count_in_s


def test_before_any_completion_the_count_waits_half_the_longest_interval():
    assert next_count_in_s(0, 200_000, 1.0, 0.05) == COUNT_EVERY_MAX_S / 2


def test_mid_run_the_count_is_at_most_the_longest_interval_apart():
    assert next_count_in_s(20_000, 200_000, 1.0, 0.05) == COUNT_EVERY_MAX_S  # ~9 s to go


def test_near_the_end_it_counts_at_half_the_expected_remaining_time_then_every_sample():
    assert next_count_in_s(190_000, 200_000, 4.75, 0.05) == 0.125  # 0.25 s to go at 40k/s
    # ~2.5 ms to go: the sample interval
    assert next_count_in_s(199_900, 200_000, 5.0, 0.05) == 0.05


def test_the_interval_never_exceeds_the_expected_remaining_time_once_a_rate_is_known():
    for done in range(1_000, 200_000, 7_000):
        remaining_s = (200_000 - done) / (done / 5.0)
        assert next_count_in_s(done, 200_000, 5.0, 0.05) <= max(0.05, remaining_s)
