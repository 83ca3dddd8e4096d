"""The membership-based bucket assignment a worker runs, one per queue (backends: PostgreSQL,
Redis).

Each member loops: heartbeat, read the view, try to lead, and, if it leads, move the assignment
towards `assign(members, current)` (leader.py); then it adopts its part. While it joins, while a
group starts together, and while the backend is unreachable (degraded), `owned()` is None and the
worker claims with SKIP LOCKED over all buckets. A member whose worker cannot work
(`liveness.failing_since`, for a heartbeat interval) leaves. Protocol:
docs/concepts/coordinator.md; reasons and measurements: docs/design/coordinator.md.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from . import metrics
from .assignment import OnRevoke
from .assignor import assign
from .backend import ClusterView, CoordinatorBackend, owned_by, unassigned
from .errors import CoordinatorError, CoordinatorUnavailable, NotLeader
from .leader import INITIAL_DELAY_MAX_S, INITIAL_SETTLE_S, Assignor, Leader

log = logging.getLogger(__name__)


class Liveness(Protocol):
    """What the coordinator reads of its worker (a plain attribute, written by the worker)."""

    @property
    def failing_since(self) -> float | None:
        """time.monotonic() since which the worker cannot work (claims or heartbeats fail); None:
        it can."""


def _jittered(interval_s: float, spread: float) -> float:
    """interval_s +/- spread: the loops of N members must not fire in lockstep."""
    return random.uniform(interval_s * (1.0 - spread), interval_s * (1.0 + spread))


class Coordinator:
    def __init__(
        self,
        backend: CoordinatorBackend,
        member: str,
        *,
        lease_s: float = 10.0,
        poll_s: float = 1.0,
        assignor: Assignor = assign,
        liveness: Liveness | None = None,
        group: str = "",
        initial_settle_s: float = INITIAL_SETTLE_S,
        initial_delay_max_s: float = INITIAL_DELAY_MAX_S,
    ) -> None:
        if lease_s < 3:
            raise ValueError("coordinator lease must be >= 3 s")
        self.backend = backend
        self.member = member
        self.lease_s = lease_s
        self.heartbeat_s = lease_s / 3  # two beats may be lost before the lease runs out
        self.poll_s = min(poll_s, self.heartbeat_s)
        # How long a hand-over waits for on_revoke: the loop does not heartbeat meanwhile, so
        # at most a heartbeat interval keeps our own lease (three intervals) safely alive.
        self.revoke_timeout_s = self.heartbeat_s
        # Our rounds as the group's leader, while we lead.
        self._leader = Leader(
            backend,
            member,
            lease_s=lease_s,
            assignor=assignor,
            initial_settle_s=initial_settle_s,
            initial_delay_max_s=initial_delay_max_s,
        )
        self._liveness = liveness
        self.resigned = False  # left the group because the worker cannot work (see the docstring)
        self.changed = asyncio.Event()
        self.view: ClusterView | None = None  # last view read (tests and `status` look at it)
        self.leading = False
        self._owned: tuple[int, ...] = ()
        # No view adopted yet, or in the last one no bucket had a live owner: SKIP LOCKED over all.
        self._unassigned = True
        self._degraded = False
        self._last_beat = -1e9
        # last successful heartbeat (or creation), for the age metric
        self._beat_at = time.monotonic()
        self._stopped = False
        self._owned_gauge = metrics.OWNED_BUCKETS.labels(group)  # group: the queue it assigns
        self._last_contact = time.monotonic()
        self._on_revoke: OnRevoke | None = None
        self._task: asyncio.Task[None] | None = None
        self.adopted = asyncio.Event()  # test signal: set after every adopted view

    # -- BucketAssignment ------------------------------------------------------------------------

    def owned(self) -> tuple[int, ...] | None:
        if self.resigned or self._stopped:
            return ()
        return None if self._degraded or self._unassigned else self._owned

    @property
    def state(self) -> str:
        """For a readiness check: joining (no view adopted yet, or the group's first assignment
        is still pending: SKIP LOCKED), member, degraded (backend unreachable past the lease:
        SKIP LOCKED), resigned (the worker cannot work) or stopped."""
        if self._stopped:
            return "stopped"
        if self.resigned:
            return "resigned"
        if self._degraded:
            return "degraded"
        return "joining" if self._unassigned else "member"

    def heartbeat_age_s(self) -> float:
        return time.monotonic() - self._beat_at

    @property
    def running(self) -> bool:
        """Test signal: the background loop is alive (it must outlive any backend failure)."""
        return self._task is not None and not self._task.done()

    async def start(self, on_revoke: OnRevoke | None = None) -> None:
        """Join: returns after the first round (our share adopted), or after it failed (then the
        loop retries in the background). The worker may claim meanwhile: owned() is None until we
        joined (module docstring). `on_revoke(buckets)` is awaited before buckets we own are
        handed over."""
        self._on_revoke = on_revoke
        metrics.HEARTBEAT_AGE.track(self)
        try:
            await self.backend.connect()
            await self._tick()
        except NotLeader:
            self.leading = False  # deposed between try_lead and apply: the loop tries again at once
        except CoordinatorError as exc:
            log.warning("coordinator backend failed at start (%s); retrying in the background", exc)
        self._task = asyncio.create_task(self._run(), name="coordinator")

    async def stop(self) -> None:
        """Leave at once so the others take our buckets now, not a lease from now."""
        self._stopped = True
        metrics.HEARTBEAT_AGE.untrack(self)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        owned = self._owned
        self._set_owned(())
        if owned:
            await self._revoke(owned)  # leaving gives up everything: same order as a hand-over
        reason = await _bounded_leave(self.backend.leave(self.member), self.lease_s)
        if reason is not None:
            log.warning("could not leave cleanly (%s): our lease will expire instead", reason)
        await self.backend.close()
        metrics.IS_LEADER.set(0)
        self._owned_gauge.set(0)

    # -- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
                # Resigned: nothing to renew; check every second whether the worker can work again.
                wait = _jittered(min(1.0, self.poll_s), 0.2) if self.resigned else self._next_wait()
            except NotLeader:
                self.leading = False
                wait = 0.0
            except Exception as exc:
                self._unreachable(exc)
                wait = _jittered(min(1.0, self.poll_s), 0.3)
            try:
                # A join concerns only a member that may lead: the leader rebalances and its apply
                # wakes the others. 8 idle workers spawned together read the view 54 times in
                # their first 3 s when every join woke every member, 43 times since (most of the
                # rest are the poll_s ticks; pg_stat_statements).
                await self.backend.wait_for_change(
                    wait, joins=self.view is None or self._may_lead(self.view)
                )
            except Exception as exc:
                self._unreachable(exc)
                await asyncio.sleep(_jittered(min(1.0, self.poll_s), 0.3))

    def _can_work(self) -> bool:
        """False once the worker has failed to work for a heartbeat interval (a third of the lease):
        then its buckets should move to workers that can poll them."""
        since = None if self._liveness is None else self._liveness.failing_since
        return since is None or time.monotonic() - since < self.heartbeat_s

    async def _tick(self) -> None:
        if not self._can_work():
            await self._resign()
            return
        if self.resigned:
            log.warning("%s can work again: rejoining the group", self.member)
            self.resigned = False
            self._last_beat = -1e9  # heartbeat now: that re-registers us
            self._last_contact = time.monotonic()  # the time resigned does not count as unreachable
            self.changed.set()
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_s * 0.9:
            await self.backend.heartbeat(self.member, self.lease_s)
            self._last_beat = self._beat_at = now
        view = await self.backend.view()
        # Only the leader (to renew) and members that see no live leader (to take over) ask: a
        # try_lead is a write, once the coordinator's costliest statement
        # (docs/design/coordinator.md).
        if self._may_lead(view):
            self.leading = await self.backend.try_lead(self.member, self.lease_s)
        else:
            self.leading = False
        metrics.IS_LEADER.set(1 if self.leading else 0)
        if self.leading:
            view = await self._leader.rebalance(view)
        self._contact()
        self.view = view
        metrics.MEMBERS.set(len(view.members))
        await self._adopt(view)

    def _may_lead(self, view: ClusterView) -> bool:
        """We lead, or the view shows no live leader (so we may take over)."""
        return (
            self.leading
            or view.leader is None
            or view.leader == self.member
            or view.leader not in view.members
        )

    async def _resign(self) -> None:
        """Leave the group while the worker cannot work, once; our lease then lapses anyway if
        leaving cannot reach the backend."""
        if self.resigned:
            return
        self.resigned = True
        self.leading = False
        metrics.IS_LEADER.set(0)
        owned = self._owned
        self._set_owned(())
        self.changed.set()
        log.warning(
            "%s cannot work (its database is unreachable or stalled): leaving the group so its %d "
            "buckets move to members that can; rejoining when it can",
            self.member,
            len(owned),
        )
        if owned:
            await self._revoke(owned)
        try:
            await self.backend.leave(self.member)
        except CoordinatorError as exc:
            log.warning(
                "could not leave the group (%s): our membership lease will run out instead", exc
            )

    async def _adopt(self, view: ClusterView) -> None:
        poll, give = owned_by(view, self.member)
        if give:
            # Stop advertising first, let the claim in flight finish (on_revoke), then hand over.
            self._set_owned(tuple(b for b in self._owned if b not in give and b in poll))
            await self._revoke(give)
            handed = await self.backend.hand_over(self.member, give)
            metrics.HANDOVERS.inc(handed)
        self._set_owned(poll)
        now_unassigned = unassigned(view)
        if now_unassigned != self._unassigned:
            self._unassigned = now_unassigned
            # between SKIP LOCKED over everything and our share, even an empty one
            self.changed.set()
        self.adopted.set()

    async def _revoke(self, buckets: tuple[int, ...]) -> None:
        """Await on_revoke(buckets), bounded; an overrun or an exception is logged, not raised."""
        if self._on_revoke is None:
            return
        try:
            await asyncio.wait_for(self._on_revoke(buckets), timeout=self.revoke_timeout_s)
        except TimeoutError:
            log.warning(
                "on_revoke(%s) overran %.1f s: handing the buckets over anyway",
                _fmt(buckets),
                self.revoke_timeout_s,
            )
        except Exception:  # the worker's callback must not stop the hand-over
            log.exception("on_revoke(%s) raised: handing the buckets over anyway", _fmt(buckets))

    def _set_owned(self, buckets: tuple[int, ...]) -> None:
        if buckets != self._owned:
            self._owned = buckets
            self._owned_gauge.set(len(buckets))
            self.changed.set()

    def _next_wait(self) -> float:
        wait = _jittered(self.poll_s, 0.2)
        expiry = self.view.next_expiry_s if self.view is not None else None
        if expiry is not None:
            wait = min(wait, expiry + 0.05)  # wake just after a lease runs out
        # Assign once the group has settled (only the leader waits for that).
        delay_left_s = self._leader.delay_left_s if self.leading else 0.0
        if delay_left_s > 0:
            wait = min(wait, delay_left_s + 0.01)
        heartbeat_due = self._last_beat + self.heartbeat_s - time.monotonic()
        return max(0.0, min(wait, heartbeat_due))

    def _contact(self) -> None:
        self._last_contact = time.monotonic()
        if self._degraded:
            self._degraded = False
            metrics.DEGRADED.set(0)
            log.warning("coordinator backend is back: polling assigned buckets again")
            self.changed.set()

    def _unreachable(self, exc: Exception) -> None:
        """A tick or wait failed: unreachable (CoordinatorUnavailable) or failing otherwise. Either
        way we have no current view; past a lease of that, fall back to SKIP LOCKED."""
        what = "unreachable" if isinstance(exc, CoordinatorUnavailable) else "failing"
        if not self._degraded and time.monotonic() - self._last_contact > self.lease_s:
            self._degraded = True
            metrics.DEGRADED.set(1)
            metrics.DEGRADED_ENTERED.inc()
            log.warning(
                "coordinator backend %s for over %.0f s (%s): falling back to SKIP LOCKED "
                "over all buckets until it is back",
                what,
                self.lease_s,
                exc,
            )
            self.changed.set()
        elif not isinstance(exc, CoordinatorError):
            # a bug: always with its traceback
            log.error("coordinator loop failed; retrying", exc_info=exc)
        elif self._degraded:
            log.debug("coordinator backend still %s: %s", what, exc)
        elif isinstance(exc, CoordinatorUnavailable):
            log.info(
                "coordinator backend unreachable (%s); keeping the last assignment for now", exc
            )
        else:
            log.warning("coordinator backend failed (%s); keeping the last assignment for now", exc)


async def _bounded_leave(leave: Coroutine[Any, Any, None], timeout_s: float) -> str | None:
    """Run `leave` for at most `timeout_s`; None if it left, else why not (never empty). Past the
    bound it is cancelled and left to finish in the background (a stalled connection may take
    psycopg ~10 s to give up): its outcome is retrieved there, so nothing logs "Task exception was
    never retrieved", and shutdown does not wait for it."""
    task = asyncio.ensure_future(leave)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout_s)
    except asyncio.CancelledError:
        _abandon(task)
        raise
    if not done:
        _abandon(task)
        return f"no answer within {timeout_s:g} s"
    exc = task.exception()
    if exc is None:
        return None
    if not isinstance(exc, CoordinatorError):
        raise exc
    return str(exc) or type(exc).__name__


def _abandon(task: asyncio.Future[None]) -> None:
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: nothing logged


def _fmt(buckets: tuple[int, ...]) -> str:
    return ",".join(map(str, buckets))
