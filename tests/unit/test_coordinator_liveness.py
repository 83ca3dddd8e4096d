"""What a coordinator reads of its worker: the worker's vitals (coordinator.Liveness), a plain
attribute, and it leaves its group once the worker has failed to work for a heartbeat interval."""

from coordinator import coordinator as coordinator_module
from coordinator.coordinator import Coordinator
from dispatcher.runtime.vitals import Vitals
from tests.helpers import run_async


class Backend:
    """Records a leave; the coordinator asks nothing else of it while it resigns."""

    def __init__(self) -> None:
        self.left: list[str] = []

    async def leave(self, member: str) -> None:
        self.left.append(member)


def test_the_member_resigns_once_its_worker_failed_for_a_heartbeat_interval(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(coordinator_module.time, "monotonic", lambda: now[0])
    vitals, backend = Vitals(), Backend()
    member = Coordinator(backend, "a", lease_s=6.0, liveness=vitals)  # type: ignore[arg-type]  # heartbeat: 2 s
    assert member._can_work()
    vitals.claims_failing_since = now[0]  # its claims fail from now on
    now[0] += 1.9
    assert member._can_work()  # a blip shorter than a heartbeat interval keeps the membership
    now[0] += 0.2
    assert not member._can_work()
    run_async(member._tick())
    assert member.resigned and member.owned() == () and member.state == "resigned"
    assert backend.left == ["a"]
    vitals.claims_failing_since = None  # it can work again
    assert member._can_work()
    vitals.heartbeats_failing_since = now[0] - 2.5  # the heartbeats' failures count the same
    assert not member._can_work()
    vitals.heartbeats_failing_since, vitals.reaper_failing_since = None, now[0] - 60
    assert member._can_work()  # the reaper's failures are a readiness matter, not a membership one


def test_without_a_liveness_the_member_can_always_work():
    assert Coordinator(Backend(), "a")._can_work()  # type: ignore[arg-type]
