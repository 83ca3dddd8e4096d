"""The stuck-handler rule on a fake clock: when a running handler is stuck, that it is said once,
and when the worker must give up; and the executor's part: a stuck handler keeps its slot."""

import asyncio
import logging
import threading

import pytest

from dispatcher.api.registry import Registry
from dispatcher.errors import ConfigError
from dispatcher.model import Job
from dispatcher.observe import metrics
from dispatcher.runtime.executor import Executor
from dispatcher.runtime.held_jobs import Running
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.runtime.stuck import StuckJob, StuckWatch, give_up_reason, stuck_jobs
from dispatcher.serve.health import Health
from dispatcher.settings.config import Config
from dispatcher.settings.sections import ExecutionSettings
from dispatcher.testing.clock import FakeClock
from tests.helpers import collected, run_async, wait_until_async
from tests.unit.test_executor import Recorder, leases

GRACE_S = 30.0


def job(job_id: int, job_type: str = "t") -> Job:
    return Job(
        id=job_id,
        job_type=job_type,
        payload={},
        attempts=1,
        max_attempts=5,
        locked_at=None,
        bucket=0,
        priority=0,
        ordering_key=None,
        token="00000000-0000-0000-0000-000000000001",
    )


def running(job_id: int, timeout_at: float | None, *, sync: bool = False) -> Running:
    # A task stands for an async handler; none for a sync one (only `task is None` is read).
    return Running(job(job_id), 0.0, 1e9, task=None if sync else object(), timeout_at=timeout_at)  # type: ignore[arg-type]


def execution(grace_s: float = GRACE_S, exit_after_s: float = 300.0) -> ExecutionSettings:
    return ExecutionSettings(
        "w1", 10.0, 2, 1.0, 60.0, stuck_grace_s=grace_s, stuck_exit_after_s=exit_after_s
    )


def test_a_handler_is_stuck_from_its_timeout_plus_the_grace_on():
    held = [running(1, 10.0), running(2, 20.0, sync=True), running(3, None)]  # 3: no timeout at all
    assert stuck_jobs(held, 39.9, GRACE_S) == []
    assert stuck_jobs(held, 40.0, GRACE_S) == [StuckJob(held[0].job, 40.0, sync=False)]
    assert [(s.job.id, s.stuck_since, s.sync) for s in stuck_jobs(held, 1e6, GRACE_S)] == [
        (1, 40.0, False),
        (2, 50.0, True),
    ]


def stuck(*since: float) -> list[StuckJob]:
    return [StuckJob(job(i), s, sync=False) for i, s in enumerate(since, 1)]


@pytest.mark.parametrize(
    ("stuck_since", "concurrency", "gives_up"),
    [
        ((), 1, False),
        ((100.0,), 1, True),  # one slot: the only one is stuck
        ((100.0,), 2, False),  # half is not over half
        ((100.0, 100.0), 3, True),
        ((100.0, 100.0), 4, False),
        ((100.0, 100.0, 100.0), 4, True),
    ],
)
def test_the_worker_gives_up_when_stuck_handlers_hold_over_half_its_slots(
    stuck_since, concurrency, gives_up
):
    reason = give_up_reason(stuck(*stuck_since), 100.0, concurrency, exit_after_s=0, sync_threads=8)
    assert (reason is not None) == gives_up
    if gives_up:
        assert f"{len(stuck_since)} of its {concurrency} slots" in reason


def test_the_worker_gives_up_once_one_handler_was_stuck_exit_after_s_and_0_turns_that_rule_off():
    jobs = stuck(100.0, 150.0)
    assert give_up_reason(jobs, 399.9, 100, exit_after_s=300, sync_threads=8) is None
    reason = give_up_reason(jobs, 400.0, 100, exit_after_s=300, sync_threads=8)
    assert reason is not None and "job 1 (t) has been stuck for 300 s" in reason
    assert give_up_reason(jobs, 1e9, 100, exit_after_s=0, sync_threads=8) is None


def test_the_worker_gives_up_when_stuck_sync_handlers_hold_over_half_its_threads():
    """Sync jobs would wait behind them, claimed and unstarted, however many slots are free."""
    threads = [StuckJob(job(i), 100.0, sync=True) for i in range(1, 5)]
    async_ones = [StuckJob(job(i), 100.0, sync=False) for i in range(5, 10)]
    assert give_up_reason(threads[:4] + async_ones, 100.0, 100, 0, sync_threads=8) is None  # half
    reason = give_up_reason(threads[:3], 100.0, 100, 0, sync_threads=4)
    assert reason is not None and "3 of its 4 sync threads" in reason


def test_the_watch_logs_each_stuck_job_once_keeps_the_gauge_and_gives_up_once(caplog):
    clock = FakeClock()
    held = [running(1, 10.0), running(2, 10.0, sync=True), running(3, 50.0)]
    reasons: list[str] = []
    watch = StuckWatch(
        lambda: held,
        execution(exit_after_s=100.0),
        concurrency=10,
        on_give_up=reasons.append,
        clock=clock,
    )
    found_before = collected(metrics.STUCK_JOBS_FOUND).get(
        ("dispatcher_stuck_jobs_found_total", ()), 0
    )
    with caplog.at_level(logging.ERROR, logger="dispatcher.runtime.stuck"):
        clock.advance(39.0)
        assert watch.check() == [] and not caplog.records
        clock.advance(1.0)
        assert [s.job.id for s in watch.check()] == [1, 2]
        clock.advance(50.0)
        assert [s.job.id for s in watch.check()] == [1, 2, 3]
        held.pop(0)  # job 1 ends after all
        assert [s.job.id for s in watch.check()] == [2, 3]
        assert collected(metrics.STUCK_JOBS)[("dispatcher_stuck_jobs", ())] == 2
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" is stuck")[0] for line in lines] == ["job 1 (t)", "job 2 (t)", "job 3 (t)"]
    assert "ignored its cancellation" in lines[0] and "thread has not returned" in lines[1]
    assert (
        collected(metrics.STUCK_JOBS_FOUND)[("dispatcher_stuck_jobs_found_total", ())]
        == found_before + 3
    )
    assert reasons == []
    clock.advance(50.0)  # job 2 stuck since 40: 100 s
    watch.check()
    watch.check()
    assert len(reasons) == 1 and "job 2 (t) has been stuck for 100 s" in reasons[0]
    assert watch.gave_up == reasons[0]


def test_a_stuck_handler_keeps_its_slot_async_swallowing_cancellation_or_sync_never_returning():
    """The executor's part, with its clock faked: the timeouts fire (real timers), the handlers
    ignore them, and the watch finds them stuck on the executor's clock; their slots stay taken."""
    registry = Registry()
    release = threading.Event()
    cancels: list[int] = []

    @registry.handler("deaf", timeout_s=0.01)
    async def deaf(job):
        while not release.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                cancels.append(job.id)

    @registry.handler("blocked", timeout_s=0.01)
    def blocked(job):
        release.wait(30)

    clock = FakeClock()
    executor = Executor(
        registry, RetryPolicy(1.0, 60.0), Recorder(), execution(), leases(), clock=clock
    )
    reasons: list[str] = []
    watch = StuckWatch(
        executor.held, execution(grace_s=5.0), concurrency=3, on_give_up=reasons.append, clock=clock
    )

    async def main():
        executor.start([job(1, "deaf"), job(2, "blocked")])
        try:
            await wait_until_async(lambda: cancels, 5, "the async handler's timeout fired")
            clock.advance(5.0)
            assert watch.check() == [], "timeout (0.01 s) + grace (5 s) not reached"
            clock.advance(0.01)
            found = watch.check()
            assert [(s.job.id, s.sync) for s in found] == [(1, False), (2, True)]
            assert executor.in_flight == 2, "a stuck handler's slot is never counted as free"
            assert len(reasons) == 1 and "2 of its 3 slots" in reasons[0]
            # A shutdown's drain does not wait for them (it would wait out the whole grace).
            await asyncio.wait_for(executor.drain(clock() + 3600, watch.count_now), 5)
            assert executor.in_flight == 2
        finally:
            release.set()  # before the loop ends: it would wait for the deaf handler for ever
            await wait_until_async(lambda: executor.in_flight == 0, 5, "both ended once released")
        assert watch.check() == []

    try:
        run_async(main())
    finally:
        executor.close()


def test_a_worker_that_gave_up_is_not_ready_and_says_why():
    health = Health(loop_stall_s=10.0)
    health.vitals.started = True
    health.vitals.stopping = health.vitals.gave_up = True
    readiness = health.readiness()
    assert not readiness.ready and readiness.checks["worker"] == "stuck"
    assert health.livez()[0] == 200, "alive: it ends itself within its bound"


def test_the_stuck_settings_reach_the_execution_section_and_must_not_be_negative():
    config = Config(stuck_grace_s=5, stuck_exit_after_s=0)
    assert (config.execution.stuck_grace_s, config.execution.stuck_exit_after_s) == (5, 0)
    assert (Config().execution.stuck_grace_s, Config().execution.stuck_exit_after_s) == (30, 300)
    for name in ("stuck_grace_s", "stuck_exit_after_s"):
        with pytest.raises(ConfigError) as info:
            Config(**{name: -1})
        assert info.value.setting == name


def test_giving_up_arms_the_exit_deadline_with_the_stuck_code_once(monkeypatch):
    from dispatcher.serve import lifecycle

    exits: list[tuple[str, int]] = []
    monkeypatch.setattr(lifecycle, "hard_exit", lambda reason, code: exits.append((reason, code)))
    signals = lifecycle.ShutdownSignals(None, lambda: None, bound_s=0.01, announce=print)  # type: ignore[arg-type]
    signals.arm(lifecycle.EXIT_STUCK)
    signals.arm()  # a SIGTERM after the give-up keeps the first deadline and its code
    assert signals._watchdog is not None
    signals._watchdog.join(5)
    assert exits == [("shutdown overran its 0.01 s bound", lifecycle.EXIT_STUCK)]
