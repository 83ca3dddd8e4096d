"""StealPolicy: when an idle partitioned worker looks in other workers' buckets."""

import itertools

from dispatcher.constants import NUM_BUCKETS
from dispatcher.runtime.stealing import MAX_SKIPPED_WAKEUPS, MAX_VICTIMS, StealPolicy


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
    gaps = [b - a for a, b in itertools.pairwise(stole)]
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
    assert not policy.due(woke_by_timer=False), (
        "the notify itself does not steal: its owner answers it"
    )
    assert policy.due(woke_by_timer=True)


def test_a_sweep_visits_every_other_bucket_once_in_random_statements_within_the_budget():
    own = {0, 5, 9}
    policy = StealPolicy(100, 500)
    sweeps = [policy.sweep(own) for _ in range(30)]
    for sweep in sweeps:
        assert all(1 <= len(chunk) <= MAX_VICTIMS for chunk in sweep)
        visited = [b for chunk in sweep for b in chunk]
        assert sorted(visited) == sorted(set(range(NUM_BUCKETS)) - own), (
            "each other bucket exactly once"
        )
    assert len({tuple(s[0]) for s in sweeps}) > 1, "in random order"
    assert policy.sweep(set(range(NUM_BUCKETS))) == [], "nothing to steal from"


def test_buckets_that_gave_jobs_are_visited_first_next_time_unless_they_became_ours():
    """A hot bucket (skew) keeps feeding the stealers that found it, instead of being found again
    by chance on each steal."""
    policy = StealPolicy(100, 500)
    policy.record(200, 200, [40, 41])
    assert policy.sweep({0, 1})[0][:2] == [40, 41]
    assert policy.sweep({40})[0][0] == 41
    policy.record(0, 100, [])
    firsts = {tuple(policy.sweep({0})[0][:2]) for _ in range(30)}
    assert len(firsts) > 1, "a steal that found nothing forgets them: back to chance"


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


def test_steals_leave_each_bucket_its_reserve_until_they_have_found_nothing_for_the_patience():
    """The end of an even drain: owners empty their shallow buckets within a claim or two, so a
    thief leaves them alone; a thief that keeps finding nothing for the patience (1 s) stops
    leaving a reserve: those owners are busy, stalled or gone."""
    now = [100.0]
    policy = StealPolicy(100, 500, 40, patience_s=1.0, clock=lambda: now[0])
    assert policy.reserve() == 40
    policy.record(0, 100)
    now[0] += 0.9
    policy.record(0, 100)
    assert policy.reserve() == 40, "found nothing for 0.9 s only"
    now[0] += 0.2
    assert policy.reserve() == 0
    policy.record(5, 100, [7])
    assert policy.reserve() == 40, "a steal that found jobs starts the patience again"
    policy.record(0, 100)
    now[0] += 5
    policy.note_own_backlog()
    assert policy.reserve() == 40, "a backlog of our own since: an old dry spell does not count"
