"""The checker the ordering-key fault tests rest on (tests/helpers.key_order_violations): it must
see each way a recording can break a key's order, and pass the overlaps a fault forces."""

from __future__ import annotations

from tests.helpers import Execution, key_order_violations

KEYS = {1: ("a", 0), 2: ("b", 0), 3: ("a", 1), 4: ("a", 2)}


def run(
    job_id: int, start: float, end: float | None, pid: int = 10, outcome: str | None = "ok"
) -> Execution:
    return Execution(job_id, 1, start, end, pid, outcome if end is not None else None)


def in_order() -> dict[int, list[Execution]]:
    return {
        1: [run(1, 0.0, 1.0)],
        2: [run(2, 0.0, 5.0)],
        3: [run(3, 1.1, 2.0)],
        4: [run(4, 2.5, 3.0)],
    }


def test_a_recording_that_kept_every_keys_order_passes():
    assert key_order_violations(in_order(), KEYS) == []


def test_a_later_job_that_starts_before_the_earlier_one_ended_is_caught():
    executions = in_order()
    executions[3] = [run(3, 0.9, 2.0)]
    [problem] = key_order_violations(executions, KEYS)
    assert "key a: job 3 started" in problem and "job 1" in problem


def test_a_job_run_out_of_order_is_caught():
    executions = in_order()
    executions[4] = [run(4, 1.5, 1.8)]  # overlaps job 3 and starts before it ended
    assert any("job 4 started" in p for p in key_order_violations(executions, KEYS))


def test_the_earlier_jobs_last_run_counts_and_a_stale_run_against_its_own_rerun_does_not():
    executions = in_order()
    # Job 1's stale run (a paused owner) ends at 1.05, beside its own re-run; job 3 starts after
    # both.
    executions[1] = [run(1, 0.0, 1.05, pid=11), run(1, 0.5, 1.0)]
    assert key_order_violations(executions, KEYS) == []
    # but ending after job 3 started: caught
    executions[1] = [run(1, 0.0, 1.5, pid=11), run(1, 0.5, 1.0)]
    assert key_order_violations(executions, KEYS)


def test_a_run_that_never_ended_lasts_until_its_process_was_killed_or_forever():
    executions = in_order()
    executions[1] = [run(1, 0.0, None, pid=11), run(1, 0.5, 1.0)]
    assert key_order_violations(executions, KEYS, cut_at={11: 0.4}) == []
    assert key_order_violations(executions, KEYS, cut_at={11: 1.2})
    assert key_order_violations(executions, KEYS)


def test_a_job_that_never_ran_to_its_end_and_ids_out_of_enqueue_order_are_caught():
    executions = in_order()
    executions[3] = [run(3, 1.1, 2.0, outcome="RuntimeError")]
    assert any("job 3 never ran to its end" in p for p in key_order_violations(executions, KEYS))
    assert any(
        "not in enqueue order" in p for p in key_order_violations(in_order(), {**KEYS, 3: ("a", 5)})
    )
