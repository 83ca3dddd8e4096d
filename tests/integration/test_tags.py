"""Tags against a real PostgreSQL: stored by every enqueue path (one job, a keyed one, a windowed
one, COPY straight in and through the staging table, enqueue_payloads), NULL for a job without;
`jobs list --tag` and the admin's Filters find exactly the jobs carrying every tag given, a bulk
cancel by tag changes exactly those, `jobs show` prints them, and bad tags are refused with nothing
written. (The dashboard: tests/web/test_tags_page.py; the in-memory store: tests/contract.)"""

import orjson
import psycopg
import pytest

from dispatcher import (
    EnqueueError,
    JobSpec,
    enqueue,
    enqueue_many,
    enqueue_many_sync,
    enqueue_payloads_sync,
    enqueue_sync,
)
from dispatcher.admin import AdminInputError, Filters, _sql, cancel_jobs, list_jobs, show_job
from tests.helpers import fetchall, fetchval, plan_nodes, run_async
from tests.integration.test_admin_cli import jobs
from tests.integration.test_cli_errors import one_line_error


def tags_of(dsn: str) -> dict[int, list[str] | None]:
    return dict(fetchall(dsn, "SELECT id, tags FROM dispatcher_jobs"))


def test_every_enqueue_path_stores_the_tags_and_a_job_without_stores_null(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        one = enqueue_sync(conn, "t", tags=["b", "a", "b"])  # duplicates dropped, order kept
        bare = enqueue_sync(conn, "t")
        keyed = enqueue_sync(conn, "t", ordering_key="k1", tags=["keyed"])
        behind = enqueue_sync(conn, "t", ordering_key="k1", tags=("keyed", "behind"))
        windowed = enqueue_sync(conn, "t", dedupe_key="d1", dedupe_window_s=60, tags=["win"])
        assert (
            enqueue_many_sync(  # COPY straight into the table
                conn,
                [JobSpec("copy", tags=["bulk", "x"]), JobSpec("copy"), JobSpec("copy", tags=[])],
            )
            == 3
        )
        assert (
            enqueue_many_sync(  # through the staging table, published with ordering keys
                conn,
                [
                    JobSpec("staged", ordering_key="k2", tags=["staged-keyed"]),
                    JobSpec("staged", ordering_key="k2", tags=["staged-keyed", "second"]),
                    JobSpec("staged", dedupe_key="d2"),
                    JobSpec("staged", dedupe_key="d3", tags=["staged-deduped"]),
                ],
            )
            == 4
        )
        assert (
            enqueue_many_sync(  # staged, dedupe keys only (the plain publish), and a window
                conn,
                [
                    JobSpec("deduped", dedupe_key="d4", tags=["deduped"]),
                    JobSpec("deduped", dedupe_key="d5", dedupe_window_s=60, tags=["win2"]),
                ],
            )
            == 2
        )
        assert enqueue_payloads_sync(conn, "many", [1, 2], tags=["shared"]) == 2
        assert enqueue_payloads_sync(conn, "many", [3], ordering_keys=["k3"], tags=["o"]) == 1
        assert enqueue_payloads_sync(conn, "many", [4]) == 1

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            single = await enqueue(conn, "async", tags=["async"])
            count = await enqueue_many(conn, [JobSpec("async", tags=["async", "bulk"])])
            return single, count

    single, count = run_async(main())
    assert count == 1
    stored = tags_of(dsn)
    assert stored[one] == ["b", "a"] and stored[bare] is None and stored[single] == ["async"]
    assert stored[keyed] == ["keyed"] and stored[behind] == ["keyed", "behind"]
    assert stored[windowed] == ["win"]
    by_type = {}
    for job_type, tags in fetchall(dsn, "SELECT job_type, tags FROM dispatcher_jobs ORDER BY id"):
        by_type.setdefault(job_type, []).append(tags)
    assert by_type["copy"] == [["bulk", "x"], None, None]
    assert by_type["staged"] == [
        ["staged-keyed"],
        ["staged-keyed", "second"],
        None,
        ["staged-deduped"],
    ]
    assert by_type["deduped"] == [["deduped"], ["win2"]]
    assert by_type["many"] == [["shared"], ["shared"], ["o"], None]
    assert by_type["async"] == [["async"], ["async", "bulk"]]
    # An empty list is no tags: NULL, as for a job given none (outside the GIN index's predicate).
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs WHERE tags IS NULL") == 5


def tagged(dsn: str) -> dict[str, int]:
    """Jobs tagged a; a and b; b; none: their ids by name."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = {
            "a": enqueue_sync(conn, "t", tags=["a"]),
            "ab": enqueue_sync(conn, "t", tags=["b", "a"]),
            "b": enqueue_sync(conn, "t", tags=["b"]),
            "none": enqueue_sync(conn, "t"),
        }
        assert enqueue_many_sync(conn, [JobSpec("t", tags=["a", "c"])]) == 1
        ids["ac"] = fetchval(dsn, "SELECT max(id) FROM dispatcher_jobs")
    return {k: v for k, v in ids.items() if v is not None}


def test_a_list_by_tag_gives_exactly_the_jobs_carrying_every_tag_given(dsn):
    ids = tagged(dsn)

    def listed(*tags: str) -> set[int]:
        return {r.id for r in list_jobs(dsn, Filters(tags=tags))}

    assert listed("a") == {ids["a"], ids["ab"], ids["ac"]}
    assert listed("a", "b") == {ids["ab"]} == listed("b", "a")
    assert listed("a", "nowhere") == set()
    assert len(listed()) == 5
    assert {r.id: r.tags for r in list_jobs(dsn, Filters(tags=("b",)))} == {
        ids["ab"]: ["b", "a"],
        ids["b"]: ["b"],
    }
    out = jobs(dsn, "list", "--tag", "a", "--tag", "b", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = orjson.loads(out.stdout)
    assert row["id"] == ids["ab"] and row["tags"] == ["b", "a"]
    assert {r["id"] for r in orjson.loads(jobs(dsn, "list", "--tag", "a,c", "--json").stdout)} == {
        ids["ac"]
    }
    table = jobs(dsn, "list", "--tag", "b").stdout.splitlines()
    assert "tags" in table[0].split() and len(table) == 3
    assert any(line.split()[0] == str(ids["ab"]) and "b,a" in line.split() for line in table)


def test_show_gives_the_tags_as_text_and_json(dsn):
    ids = tagged(dsn)
    detail = show_job(dsn, ids["ab"])
    assert detail is not None and detail.job["tags"] == ["b", "a"]
    shown = jobs(dsn, "show", str(ids["ab"]))
    assert shown.returncode == 0 and "  tags                 b,a" in shown.stdout.splitlines()
    assert orjson.loads(jobs(dsn, "show", str(ids["ab"]), "--json").stdout)["job"]["tags"] == [
        "b",
        "a",
    ]
    bare = jobs(dsn, "show", str(ids["none"])).stdout.splitlines()
    assert "  tags                 -" in bare


def test_a_bulk_cancel_by_tag_cancels_exactly_the_jobs_carrying_it(dsn):
    ids = tagged(dsn)
    result = cancel_jobs(dsn, Filters(tags=("a", "b")))
    assert result.changed == [ids["ab"]] and result.matched == 1
    counted = jobs(dsn, "cancel", "--tag", "a")
    assert counted.returncode == 1 and counted.stdout.startswith("2 jobs match"), counted
    done = jobs(dsn, "cancel", "--tag", "a", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(orjson.loads(done.stdout)["changed"]) == sorted([ids["a"], ids["ac"]])
    assert dict(fetchall(dsn, "SELECT id, status FROM dispatcher_jobs")) == {
        ids["a"]: "cancelled",
        ids["ab"]: "cancelled",
        ids["ac"]: "cancelled",
        ids["b"]: "queued",
        ids["none"]: "queued",
    }
    purged = jobs(dsn, "purge", "--tag", "c", "--yes")
    assert purged.returncode == 0 and purged.stdout.startswith("purged 1 of 1"), purged
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 4


BAD_TAGS = [
    "urgent",  # a string, not a list of them
    ["has space"],
    [""],
    ["x" * 65],
    ["a,b"],
    ['quo"te'],
    [1],
    [f"t{i}" for i in range(17)],
]


@pytest.mark.parametrize("bad", BAD_TAGS, ids=repr)
def test_bad_tags_are_refused_naming_tags_and_nothing_is_written(dsn, bad):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(EnqueueError) as one:
            enqueue_sync(conn, "t", tags=bad)
        with pytest.raises(EnqueueError) as many:
            enqueue_many_sync(conn, [JobSpec("t", tags=["ok"]), JobSpec("t", tags=bad)])
        with pytest.raises(EnqueueError) as payloads:
            enqueue_payloads_sync(conn, "t", [1, 2], tags=bad)
    assert one.value.option == many.value.option == payloads.value.option == "tags"
    assert "job #1" in str(many.value)
    assert fetchval(dsn, "SELECT count(*) FROM dispatcher_jobs") == 0


def test_a_filter_by_a_bad_tag_is_refused_before_any_statement(dsn):
    with pytest.raises(AdminInputError) as bad:
        Filters(tags=("no spaces",))
    assert bad.value.option == "tags"
    one_line_error(jobs(dsn, "list", "--tag", "no{brace}"), 2, "--tag")


def test_a_filter_by_tag_reads_the_tags_index_not_the_table(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_payloads_sync(conn, "t", range(20_000))
        enqueue_payloads_sync(conn, "t", range(5), tags=["rare"])
        conn.execute("ANALYZE dispatcher_jobs")
        params = Filters(tags=("rare",)).params()
        ((plan,),) = conn.execute(
            "EXPLAIN (FORMAT JSON) " + _sql("admin_jobs_count"), params
        ).fetchall()
    indexes = {n.get("Index Name") for n in plan_nodes(plan[0]["Plan"])}
    assert "dispatcher_jobs_tags_idx" in indexes, plan
