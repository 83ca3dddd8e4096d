"""The due timer's decisions on a fake clock, and the NOTIFY payload that feeds it."""

from dispatcher.db.listener import parse_payload
from dispatcher.runtime.due_timer import DueTimer


class FakeHandle:
    def __init__(self, when: float, callback) -> None:
        self._when, self.callback, self.cancelled = when, callback, False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    def __init__(self) -> None:
        self.now = 100.0
        self.handles: list[FakeHandle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback) -> FakeHandle:
        handle = FakeHandle(when, callback)
        self.handles.append(handle)
        return handle

    def pending(self) -> list[FakeHandle]:
        return [h for h in self.handles if not h.cancelled]

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while due := sorted((h for h in self.pending() if h.when() <= end), key=FakeHandle.when):
            self.now = max(self.now, due[0].when())
            due[0].cancelled = True  # ran
            due[0].callback()
        self.now = end


def _timer() -> tuple[DueTimer, FakeLoop, list[float]]:
    loop, fired = FakeLoop(), []
    return DueTimer(lambda: fired.append(loop.now), loop), loop, fired  # type: ignore[arg-type]


class EarlyLoop(FakeLoop):
    """A scheduler that runs timers up to 2 ms before their time, as uvloop's millisecond-cached
    clock can."""

    def call_at(self, when: float, callback) -> FakeHandle:
        return super().call_at(max(self.now, when - 0.002), callback)


def test_a_timer_that_fires_early_waits_for_the_rest_of_its_delay():
    loop, fired = EarlyLoop(), []
    timer = DueTimer(lambda: fired.append(loop.now), loop)  # type: ignore[arg-type]
    timer.arm(0.5)
    loop.advance(0.499)
    assert fired == [] and timer.deadline == 100.5  # fired at 100.498: armed again for the rest
    loop.advance(0.01)
    assert fired and fired[0] >= 100.5 and timer.deadline is None


def test_fires_at_the_delay_from_when_it_was_armed():
    timer, loop, fired = _timer()
    assert timer.arm(1.5)
    assert timer.deadline == 101.5
    loop.advance(1.4)
    assert fired == []
    loop.advance(0.1)
    assert fired == [101.5]
    assert timer.deadline is None


def test_keeps_one_timer_the_earliest():
    timer, loop, fired = _timer()
    timer.arm(3.0)
    assert not timer.arm(5.0), "a later deadline must not replace an earlier one"
    assert not timer.arm(3.0)
    assert timer.arm(1.0), "an earlier deadline replaces the pending one"
    assert [h.when() for h in loop.pending()] == [101.0]
    loop.advance(10)
    assert fired == [101.0], "the replaced timer must not fire too"


def test_a_past_run_at_fires_at_once_and_cancel_disarms():
    timer, loop, fired = _timer()
    timer.arm(-2.0)
    assert timer.deadline == 100.0
    timer.cancel()
    loop.advance(1)
    assert fired == [] and timer.deadline is None
    timer.arm(0.5)  # armable again after a cancel or a fire
    loop.advance(1)
    assert fired == [101.5]


def _old_parse_payload(payload: str) -> tuple[str, int | None]:
    """The parser of releases before the due timer, verbatim: what an old pod does in a rolling
    upgrade."""
    queue, sep, tail = payload.rpartition(":")
    if sep and tail.isdigit():
        return queue, int(tail)
    return payload, None


def test_payloads_parse_and_old_workers_ignore_the_delay():
    assert parse_payload("emails") == ("emails", None, None)
    assert parse_payload("emails:17") == ("emails", 17, None)
    assert parse_payload("emails:17:1500") == ("emails", 17, 1.5)
    assert parse_payload("emails:x:1500") == ("emails:x:1500", None, None)
    # Immediate jobs: unchanged payloads, read the same by old and new workers.
    assert _old_parse_payload("emails:17") == ("emails", 17)
    # A delayed job's payload names, to an old worker, a queue with a ':' that no worker can serve
    # (NAME_PATTERN): it drops the notification, and polls the job up as it always did.
    old_queue, _ = _old_parse_payload("emails:17:1500")
    assert old_queue == "emails:17"
    from dispatcher.constants import is_valid_name

    assert not is_valid_name(old_queue)
