"""Two deployments on ONE Redis database, each with its own PostgreSQL database and the same
queue name, kept apart by DISPATCHER_REDIS_KEY_PREFIX (issue 28): real `dispatcher run`
processes, each fleet's group seen through its own keys. Without different prefixes they merge
into one group, which the last step shows. Key names, validation:
tests/unit/test_redis_key_prefix.py."""

import uuid

import psycopg
import pytest
import redis

from coordinator.backend_redis import RedisBackend
from dispatcher import JobSpec, enqueue_many_sync
from dispatcher.constants import DEFAULT_QUEUE
from dispatcher.serve.coordination import redis_prefix
from tests.coordination import ViewSampler
from tests.databases import scratch_database
from tests.helpers import start_worker, status_counts, stop_workers, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def other_dsn(pg_admin_dsn, template_db):
    """The second fleet's database: migrated, empty, its own."""
    with scratch_database(pg_admin_dsn, "dispatcher_test", template=template_db) as test_dsn:
        yield test_dsn


@pytest.fixture
def tag(redis_url):
    """A word of this test's own in every prefix and worker id; its keys are deleted afterwards
    (the Redis may be shared: nothing else is touched)."""
    tag = uuid.uuid4().hex[:10]
    yield tag
    with redis.Redis.from_url(redis_url) as r:
        keys = list(r.scan_iter(match=f"*{tag}*"))
        if keys:
            r.delete(*keys)


def options(redis_url, prefix):
    return dict(
        coordinator="redis",
        redis_url=redis_url,
        redis_key_prefix=prefix,
        coordinator_lease_s=3,
        coordinator_poll_s=0.5,
        poll_interval_s=0.2,
        flush_interval_s=0.02,
        steal="false",
    )


def sampler(redis_url, prefix):
    """The group of DEFAULT_QUEUE under `prefix`, as a worker of that fleet reads it."""
    return ViewSampler(lambda: RedisBackend(redis_url, prefix=redis_prefix(DEFAULT_QUEUE, prefix)))


def test_two_fleets_on_one_redis_database_never_meet(dsn, other_dsn, redis_url, tag, tmp_path):
    a, b = f"fleet-a-{tag}", f"fleet-b-{tag}"
    fleets = {
        a: (dsn, {f"a{i}-{tag}" for i in range(2)}),
        b: (other_dsn, {f"b{i}-{tag}" for i in range(3)}),
    }
    workers = []
    with sampler(redis_url, a) as view_a, sampler(redis_url, b) as view_b:
        views = {a: view_a, b: view_b}
        try:
            for prefix, (db, ids) in fleets.items():
                workers += [
                    start_worker(
                        db,
                        tmp_path,
                        log_path=tmp_path / f"{w}.out",
                        worker_id=w,
                        **options(redis_url, prefix),
                    )
                    for w in sorted(ids)
                ]
            owners = {
                p: wait_until(
                    lambda p=p: views[p].settled(fleets[p][1]),
                    60,
                    f"{p}: its workers own all buckets",
                )
                for p in fleets
            }
            for p, (_, ids) in fleets.items():
                # 2 and 3 members: 32/32, 22/21/21
                assert len(owners[p]) == 64 and set(owners[p].values()) == ids

            # Each fleet's keys hold its own workers only, and nothing of theirs is anywhere else.
            with redis.Redis.from_url(redis_url, decode_responses=True) as r:
                for p, (_, ids) in fleets.items():
                    group = redis_prefix(DEFAULT_QUEUE, p)
                    assert set(r.zrange(f"{group}:members", 0, -1)) == ids
                    assert r.get(f"{group}:leader") in ids
                    assert set(r.scan_iter(match=f"{p}:*")) == {
                        f"{group}:members",
                        f"{group}:leader",
                        f"{group}:buckets",
                        *(f"{group}:member:{w}" for w in ids),
                    }
                ours = set(r.scan_iter(match=f"*{tag}*"))
                # e.g. no dispatcher:default:...
                assert all(k.startswith((f"{a}:", f"{b}:")) for k in ours), ours

            # Without stealing, each fleet completes a job in every bucket of its own database: its
            # group covers all 64 buckets there.
            for db in (dsn, other_dsn):
                with psycopg.connect(db, autocommit=True) as conn:
                    enqueue_many_sync(
                        conn, [JobSpec("record", {}, bucket=bucket) for bucket in range(64)]
                    )
            for db in (dsn, other_dsn):
                wait_until(
                    lambda db=db: status_counts(db).get("completed", 0) == 64,
                    30,
                    "every bucket's job done",
                )

            # Never, in any view read meanwhile, did a fleet see a member or leader of the other.
            for p, (_, ids) in fleets.items():
                seen = {
                    m for _, v in views[p].samples for m in (*v.members, v.leader) if m is not None
                }
                assert seen <= ids, seen - ids

            # The same prefix merges: a worker of fleet B's database given fleet A's prefix joins
            # A's group.
            stray = f"stray-{tag}"
            workers.append(
                start_worker(
                    other_dsn,
                    tmp_path,
                    log_path=tmp_path / "stray.out",
                    worker_id=stray,
                    **options(redis_url, a),
                )
            )
            wait_until(
                lambda: views[a].settled(fleets[a][1] | {stray}), 30, "the stray in fleet A's group"
            )
            assert views[b].settled(fleets[b][1]), "fleet B's group is unchanged"
        finally:
            codes = stop_workers(workers)
    assert codes == [0] * len(workers), [
        log.read_text()[-2000:] for log in sorted(tmp_path.glob("*.out"))
    ]
