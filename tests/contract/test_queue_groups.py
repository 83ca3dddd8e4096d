"""One coordination group per queue, over every backend: a queue's 64 buckets are shared among
the live members that serve it (Kafka's per-topic assignment), and a member that cannot work
leaves its groups so its buckets move to members that can, then rejoins.

Real Coordinator objects on one cluster, as the workers of one deployment run them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from coordinator.buckets import NUM_BUCKETS
from coordinator.coordinator import Coordinator
from tests.contract.support import BackendFactory
from tests.helpers import run_async, wait_until_async

LEASE_S = 3.0  # the coordinator's minimum
CONVERGE_S = 20.0  # generous on a loaded 2-core machine; the assertions are about the outcome


class Flagged:
    """A member's liveness (coordinator.Liveness): while its flag is false, its worker has failed
    to work for a whole lease already, so the coordinator gives its membership up at once."""

    def __init__(self, flags: dict[str, bool], member: str) -> None:
        self._flags, self._member = flags, member

    @property
    def failing_since(self) -> float | None:
        return None if self._flags.get(self._member, True) else time.monotonic() - LEASE_S


@contextlib.asynccontextmanager
async def members(
    factory: BackendFactory,
    serving: dict[str, tuple[str, ...]],
    can_work: dict[str, bool] | None = None,
) -> AsyncIterator[dict[tuple[str, str], Coordinator]]:
    """Started coordinators, one per (member, queue it serves); stopped afterwards."""
    flags = can_work if can_work is not None else {}
    made = {
        (m, q): Coordinator(factory(q), m, lease_s=LEASE_S, poll_s=0.2, liveness=Flagged(flags, m))
        for m, queues in serving.items()
        for q in queues
    }
    try:
        await asyncio.gather(*(c.start() for c in made.values()))
        yield made
    finally:
        await asyncio.gather(*(c.stop() for c in made.values()), return_exceptions=True)


def split(made: dict[tuple[str, str], Coordinator], queue: str) -> dict[str, int] | None:
    """member -> buckets it owns in `queue`'s group, if the group's buckets are exactly
    partitioned."""
    owned = {m: c.owned() for (m, q), c in made.items() if q == queue}
    if any(o is None for o in owned.values()):
        return None
    buckets = [b for o in owned.values() for b in o]  # type: ignore[union-attr]
    if sorted(buckets) != list(range(NUM_BUCKETS)):
        return None
    return {m: len(o) for m, o in owned.items()}  # type: ignore[arg-type]


def test_each_queues_buckets_go_only_to_the_members_serving_it(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        serving = {"a": ("qa",), "b": ("qb",), "c": ("qa", "qb")}
        async with members(backend_factory, serving) as made:
            await wait_until_async(
                lambda: (
                    split(made, "qa") == {"a": 32, "c": 32}
                    and split(made, "qb") == {"b": 32, "c": 32}
                ),
                CONVERGE_S,
                lambda: f"balanced per queue: qa {split(made, 'qa')}, qb {split(made, 'qb')}",
            )
            for (_m, q), c in made.items():  # each group sees only its own members
                assert c.view is not None and set(c.view.members) == {
                    x for x, qs in serving.items() if q in qs
                }
            kept = set(made["a", "qa"].owned() or ())
            await made["c", "qa"].stop()  # c stops serving qa: only qa's buckets move, all to a
            await wait_until_async(
                lambda: made["a", "qa"].owned() == tuple(range(NUM_BUCKETS)),
                CONVERGE_S,
                "a owns all of qa",
            )
            assert kept <= set(made["a", "qa"].owned() or ()), "a kept its buckets (sticky)"
            assert split(made, "qb") == {"b": 32, "c": 32}, "qb's group did not move"

    run_async(main())


def test_a_member_that_cannot_work_leaves_its_groups_and_rejoins(
    backend_factory: BackendFactory,
) -> None:
    async def main() -> None:
        flags = {"a": True, "b": True}
        async with members(backend_factory, {"a": ("q",), "b": ("q",)}, flags) as made:
            await wait_until_async(
                lambda: split(made, "q") == {"a": 32, "b": 32}, CONVERGE_S, "balanced"
            )
            loop = asyncio.get_running_loop()
            flags["a"] = False  # a's database went away; its coordinator still answers
            stopped_at = loop.time()
            await wait_until_async(
                lambda: split(made, "q") == {"a": 0, "b": 64},
                CONVERGE_S,
                lambda: f"b takes all: {split(made, 'q')}",
            )
            moved_s = loop.time() - stopped_at
            assert made["a", "q"].resigned
            assert moved_s <= LEASE_S + 1.0, f"a's buckets moved after {moved_s:.1f} s"
            flags["a"] = True
            await wait_until_async(
                lambda: split(made, "q") == {"a": 32, "b": 32}, CONVERGE_S, "a rejoined"
            )
            assert not made["a", "q"].resigned

    run_async(main())
