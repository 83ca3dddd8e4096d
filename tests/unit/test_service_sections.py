"""Each maintenance service is built from its own settings section (dispatcher/settings/sections.py)
and reports its failures in the worker's vitals, which the producer, the coordinators and the
health probes read. Fakes for the store and the executor: the SQL is tested in tests/integration."""

from __future__ import annotations

import asyncio

from dispatcher.errors import StoreUnavailable
from dispatcher.runtime.janitor import Pruner
from dispatcher.runtime.maintenance import LeaseKeeper, Reaper
from dispatcher.runtime.retry import RetryPolicy
from dispatcher.runtime.vitals import Vitals
from dispatcher.settings.config import Config
from tests.helpers import run_async, wait_until_async


class Store:
    """A database that fails while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.pings = 0
        self.expiry_reads = 0

    async def ping(self) -> None:
        self.pings += 1
        if self.down:
            raise StoreUnavailable("ping: database unavailable")

    async def jobs_lease_expired(self) -> list:
        self.expiry_reads += 1
        if self.down:
            raise StoreUnavailable("reap: database unavailable")
        return []


class Holding:
    """An executor holding one job that is not due for a heartbeat yet."""

    in_flight = 1

    def running_since(self, before: float) -> list:
        return []


def test_the_lease_keeper_beats_at_its_sections_interval_and_writes_a_stall_to_the_vitals():
    leases = Config(lease_s=12).leases
    vitals, store = Vitals(), Store()
    keeper = LeaseKeeper(store, Holding(), leases, vitals=vitals)  # type: ignore[arg-type]
    assert keeper.interval_s == leases.heartbeat_s == 4

    async def main() -> None:
        assert await keeper.tick() is None and store.pings == 1 and not vitals.stalled
        store.down = True
        assert await keeper.tick() is not None  # probes again within about a second
        since = vitals.heartbeats_failing_since
        assert (
            since is not None
            and vitals.stalled
            and keeper.stalled
            and vitals.failing_since == since
        )
        await keeper.tick()
        assert vitals.heartbeats_failing_since == since  # since the first failure
        store.down = False
        await keeper.tick()
        assert vitals.heartbeats_failing_since is None and not vitals.stalled

    run_async(main())


def test_the_reaper_takes_its_section_and_writes_its_failures_to_the_vitals():
    config = Config(reaper_interval_s=0.01)
    vitals, store = Vitals(), Store()
    reaper = Reaper(
        store,
        RetryPolicy(1.0, 2.0),
        config.maintenance,
        on_reaped=lambda: None,  # type: ignore[arg-type]
        vitals=vitals,
    )
    assert reaper.interval_s == 0.01

    async def main() -> None:
        task = asyncio.create_task(reaper.run())
        try:
            store.down = True
            await wait_until_async(
                lambda: vitals.reaper_failing_since is not None, 5, "a failed reap in the vitals"
            )
            # not a reason to leave the group
            assert vitals.database_failing and vitals.failing_since is None
            store.down = False
            await wait_until_async(
                lambda: vitals.reaper_failing_since is None, 5, "a reap that works again"
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    run_async(main())


def test_the_pruner_takes_its_retention_section():
    config = Config(
        prune_interval_s=30, completed_retention_s=0, failed_retention_s=60, prune_batch=7
    )
    pruner = Pruner(Store(), config.retention)  # type: ignore[arg-type]
    assert pruner.interval_s == 30 and pruner._batch == 7
    assert pruner._retentions_s == {"failed": 60, "history": 604800}  # completed: kept forever
