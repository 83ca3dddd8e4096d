"""Per-job metrics counted in plain Python and exported at scrape time
(dispatcher/observe/job_metrics.py)."""

import sys

import pytest

from dispatcher.db.rows import Completion, FailedWrite
from dispatcher.model import Job, Outcome
from dispatcher.observe.job_metrics import OTHER_TYPE, OUTCOMES, JobCollector, JobStats
from dispatcher.runtime.completer import Completer
from dispatcher.settings.sections import CompletionSettings
from tests.helpers import collected, run_async


def test_the_histogram_is_cumulative_with_prometheus_bucket_bounds():
    stats = JobStats(bounds_s=(0.1, 1.0))
    # a duration equal to a bound is in that bucket (le)
    for duration_s in (0.05, 0.1, 0.1000001, 1.0, 7.0):
        stats.finished("q", "t", "completed", duration_s)
    out = collected(JobCollector(stats))
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in out.items()
        if name == "dispatcher_job_duration_seconds_bucket"
    }
    assert buckets == {"0.1": 2, "1.0": 4, "+Inf": 5}
    assert out[("dispatcher_job_duration_seconds_count", (("job_type", "t"), ("queue", "q")))] == 5
    assert out[
        ("dispatcher_job_duration_seconds_sum", (("job_type", "t"), ("queue", "q")))
    ] == pytest.approx(8.2500001)


def test_every_outcome_and_the_timeouts_are_exported_per_queue_and_job_type_from_the_first_job():
    stats = JobStats()
    stats.finished("q", "a", "completed", 0.01)
    stats.finished("q", "a", "retried", 0.01)
    stats.finished("q", "a", "retried", 0.01)
    stats.finished("mail", "a", "failed", 0.01)
    stats.timed_out("q", "b")
    out = collected(JobCollector(stats))
    outcomes = {
        (dict(k)["queue"], dict(k)["job_type"], dict(k)["outcome"]): v
        for (name, k), v in out.items()
        if name == "dispatcher_job_outcomes_total"
    }
    assert outcomes == {
        **{("q", "a", o): 0 for o in OUTCOMES},
        ("q", "a", "completed"): 1,
        ("q", "a", "retried"): 2,
        **{("mail", "a", o): 0 for o in OUTCOMES},
        ("mail", "a", "failed"): 1,
        **{("q", "b", o): 0 for o in OUTCOMES},
    }
    assert out[("dispatcher_job_timeouts_total", (("job_type", "a"), ("queue", "q")))] == 0
    assert out[("dispatcher_job_timeouts_total", (("job_type", "b"), ("queue", "q")))] == 1
    assert out[("dispatcher_job_duration_seconds_count", (("job_type", "b"), ("queue", "q")))] == 0


def test_queue_waits_are_a_histogram_per_queue():
    stats = JobStats(wait_bounds_s=(0.1, 10.0))
    stats.waited("q", [0.0, 0.1, 3.0])
    stats.waited("q", [])
    stats.waited("mail", [100.0])
    out = collected(JobCollector(stats))
    buckets = {
        (dict(k)["queue"], dict(k)["le"]): v
        for (name, k), v in out.items()
        if name == "dispatcher_job_queue_wait_seconds_bucket"
    }
    assert buckets == {
        ("q", "0.1"): 2,
        ("q", "10.0"): 3,
        ("q", "+Inf"): 3,
        ("mail", "0.1"): 0,
        ("mail", "10.0"): 0,
        ("mail", "+Inf"): 1,
    }
    assert out[("dispatcher_job_queue_wait_seconds_sum", (("queue", "q"),))] == pytest.approx(3.1)


def test_job_types_past_the_cap_are_counted_together():
    stats = JobStats(max_types=3)
    for i in range(10):
        stats.finished("q", f"type{i}", "failed", 0.0)
    types = {job_type for (_, job_type), *_ in stats.snapshot()}
    assert types == {"type0", "type1", OTHER_TYPE}
    assert {t: outcomes["failed"] for (_, t), _, _, outcomes, _ in stats.snapshot()} == {
        "type0": 1,
        "type1": 1,
        OTHER_TYPE: 8,
    }


class FakeExecutor:
    def __init__(self, running):
        self.running = running

    def running_by_queue(self):
        return dict(self.running)


def test_running_jobs_are_summed_over_executors_and_every_served_queue_is_collected():
    collector = JobCollector(JobStats())
    one, two = FakeExecutor({"default": 2}), FakeExecutor({"default": 1, "mail": 4})
    collector.track(one, ["default", "idle"])
    collector.track(two, ["default", "mail"])
    out = collected(collector)
    running = {
        dict(k)["queue"]: v for (name, k), v in out.items() if name == "dispatcher_jobs_running"
    }
    assert running == {"default": 3, "idle": 0, "mail": 4}
    collector.untrack(two)
    out = collected(collector)
    assert {
        dict(k)["queue"]: v for (name, k), v in out.items() if name == "dispatcher_jobs_running"
    } == {"default": 2, "idle": 0}


class AcceptingStore:
    """Accepts every write but those of `fence` (their token changed), as the real statements
    answer."""

    worker_id = "w"

    def __init__(self, fence: frozenset[int] = frozenset()) -> None:
        self.fence = fence

    async def jobs_complete(self, ids, tokens, *, keyed=False, chain=None, buckets=None):
        fenced = [i for i in ids if i in self.fence]
        return Completion(len(ids) - len(fenced), fenced)

    async def jobs_fail_owned(self, failures, *, lease_expired=False):
        return [
            FailedWrite(f.id, f.outcome.status, 1, "w", None, snoozed=f.snooze is not None)
            for f in failures
            if f.id not in self.fence
        ]


def job(job_type: str, job_id: int = 1) -> Job:
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
        token=f"00000000-0000-0000-0000-{job_id:012d}",
        queue="q",
    )


def test_the_completer_counts_each_attempt_whose_write_was_accepted_and_no_fenced_one():
    stats = JobStats()
    store = AcceptingStore(fence=frozenset({6, 7}))
    completer = Completer(
        store, CompletionSettings(flush_interval_s=1, flush_max=100, history=False), job_stats=stats
    )
    completer.completed(job("x", 1), 0.5)
    completer.failed(job("x", 2), Outcome("queued", 1.0, "boom"), 0.25)
    completer.failed(job("x", 3), Outcome("failed", 0.0, "boom"), 0.25)
    completer.failed(job("y", 4), Outcome("discarded", 0.0, "permanent"), 2.0)
    completer.failed(
        job("y", 5), Outcome("failed", 0.0, "snoozed too often"), 1.0, snooze=(5.0, 100)
    )
    completer.completed(job("x", 6), 0.5)  # fenced: another owner runs it now
    completer.failed(job("x", 7), Outcome("queued", 1.0, "boom"), 0.25)  # fenced
    assert stats.snapshot() == [], "nothing is counted before its write"
    run_async(completer.flush())
    by_type = {
        t: (sum(buckets), total, outcomes)
        for (q, t), buckets, total, outcomes, _ in stats.snapshot()
    }
    assert {q for (q, _), *_ in stats.snapshot()} == {"q"}
    assert by_type["x"][:2] == (3, 1.0)
    assert {o: n for o, n in by_type["x"][2].items() if n} == {
        "completed": 1,
        "retried": 1,
        "failed": 1,
    }
    assert {o: n for o, n in by_type["y"][2].items() if n} == {"discarded": 1, "snoozed": 1}
    assert by_type["y"][:2] == (2, 3.0)
    assert (completer.stats.fenced, completer.stats.snoozed) == (2, 1)


def test_the_executor_counts_running_handlers_by_queue_and_timeouts_by_job_type():
    """Running: an async handler suspended, one still inside its eager start (seen from another
    thread, as a scrape sees it), a sync one in its thread; not one waiting for a thread."""
    import asyncio
    import threading

    from dispatcher.api.registry import Registry
    from dispatcher.runtime.executor import Executor
    from dispatcher.runtime.retry import RetryPolicy
    from tests.helpers import run_async, wait_until_async
    from tests.unit.test_executor import execution, leases

    registry = Registry()
    release = threading.Event()
    seen_from_a_thread: list[dict[str, int]] = []

    @registry.handler("suspends")
    async def suspends(job):
        await asyncio.sleep(3600)

    @registry.handler("blocks")
    async def blocks(job):  # no await: runs inside start(); a scrape thread looks meanwhile
        scrape = threading.Thread(
            target=lambda: seen_from_a_thread.append(executor.running_by_queue())
        )
        scrape.start()
        scrape.join()

    @registry.handler("sync")
    def sync(job):
        release.wait(10)

    @registry.handler("slow", timeout_s=0.05)
    async def slow(job):
        await asyncio.sleep(3600)

    class Sink:
        def completed(self, job, duration_s, result=None): ...
        def failed(self, job, outcome, duration_s, **details): ...

    stats = JobStats()
    executor = Executor(
        registry,
        RetryPolicy(1.0, 60.0),
        Sink(),
        execution(sync_threads=1),
        leases(),
        job_stats=stats,
    )

    def queued(job_id, job_type, queue):
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
            queue=queue,
        )

    async def main():
        # In order: two async ones suspend, two sync ones wait for the pump after the batch, and
        # "blocks" looks from a thread while it runs inside its eager start.
        executor.start(
            [
                queued(1, "suspends", "a"),
                queued(5, "slow", "a"),
                queued(2, "sync", "b"),
                queued(3, "sync", "b"),
                queued(4, "blocks", "c"),
            ]
        )
        running = executor.running_by_queue()
        await wait_until_async(
            lambda: (
                stats.snapshot() and any(t == ("a", "slow") and n for t, *_, n in stats.snapshot())
            ),
            5,
            "the slow job timed out",
        )
        executor.take_unstarted()
        release.set()
        assert await executor.interrupt(5) == 0
        executor.close()
        return running

    running = run_async(main())
    # Python < 3.12 has no eager tasks: "blocks" runs on the loop after start(), the sync pump done.
    assert seen_from_a_thread == [
        {"a": 2, "c": 1} if sys.version_info >= (3, 12) else {"a": 2, "b": 1, "c": 1}
    ]
    assert running == {"a": 2, "b": 1}  # after start(): 1 of the 2 sync ones has the one thread
    assert {t: n for t, *_, n in stats.snapshot()} == {("a", "slow"): 1}
