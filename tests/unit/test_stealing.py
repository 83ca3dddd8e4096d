"""StealPolicy: when an idle partitioned worker looks in other workers' buckets."""

from dispatcher.constants import NUM_BUCKETS
from dispatcher.runtime.stealing import MAX_SKIPPED_WAKEUPS, StealPolicy


def timer_wakeups_that_steal(policy: StealPolicy, wakeups: int, found: int = 0) -> list[int]:
    """Drive `wakeups` idle timer wake-ups; each steal finds `found` jobs. Which ones stole."""
    stole = []
    for i in range(wakeups):
        if policy.due(woke_by_timer=True):
            stole.append(i)
            policy.record(found, 100)
    return stole


def test_first_timer_wakeup_steals_then_empty_steals_back_off_to_every_eighth():
    stole = timer_wakeups_that_steal(StealPolicy(100, 500), 40)
    gaps = [b - a for a, b in zip(stole, stole[1:])]
    assert stole[0] == 0
    assert gaps[:4] == [2, 3, 5, 9]  # skip 1, 2, 4, 8 wake-ups
    assert set(gaps[3:]) == {MAX_SKIPPED_WAKEUPS + 1}


def test_a_notify_wakeup_alone_never_steals():
    policy = StealPolicy(100, 500)
    assert not policy.due(woke_by_timer=False)


def test_productive_steals_continue_on_every_cycle_and_reset_the_backoff():
    policy = StealPolicy(100, 500)
    timer_wakeups_that_steal(policy, 20)  # backed off
    policy.note_foreign_notify()
    assert policy.due(woke_by_timer=True)
    policy.record(5, 100)
    assert policy.due(woke_by_timer=False), "while steals find work, every cycle steals"
    policy.record(0, 100)
    assert not policy.due(woke_by_timer=False)
    assert timer_wakeups_that_steal(policy, 6) == [1, 4], "the back-off restarts: skip 1, then 2"


def test_a_foreign_notify_ends_the_backoff_at_the_next_timer_wakeup():
    policy = StealPolicy(100, 500)
    timer_wakeups_that_steal(policy, 30)
    assert not policy.due(woke_by_timer=True)
    policy.note_foreign_notify()
    assert not policy.due(woke_by_timer=False), "the notify itself does not steal: its owner answers it"
    assert policy.due(woke_by_timer=True)


def test_victims_are_every_other_bucket_once_rotated():
    own = {0, 5, 9}
    orders = {tuple(StealPolicy.victims(own)) for _ in range(50)}
    others = [b for b in range(NUM_BUCKETS) if b not in own]
    for order in orders:
        start = others.index(order[0])
        assert list(order) == others[start:] + others[:start]
    assert len(orders) > 1, "the starting point is random"


def test_full_steals_grow_the_batch_to_the_claim_size_and_a_short_one_resets_it():
    """Skew: steals that come back full mean a deep backlog elsewhere, so ask for more each time."""
    policy = StealPolicy(100, 500)
    sizes = []
    for _ in range(5):
        asked = policy.batch(free=1000)
        sizes.append(asked)
        policy.record(asked, asked)
    assert sizes == [100, 200, 400, 500, 500]
    assert policy.batch(free=150) == 150, "never more than the free slots"
    policy.record(30, 500)
    assert policy.batch(free=1000) == 100, "a short steal (sparse tail) goes back to the base size"
