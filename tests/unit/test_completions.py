"""The completion statements per DISPATCHER_COMPLETED_JOBS (dispatcher/db/completions.py): under
archive, the deleting completion with the move to the archive added to the same statement, on one
node and pinned to a bucket on a Citus cluster."""

import pytest

from dispatcher.constants import COMPLETED_ARCHIVE, COMPLETED_DELETE, COMPLETED_KEEP
from dispatcher.db.completions import archiving, completion_statements
from dispatcher.db.queries import query
from dispatcher.db.sharded import ShardedStatements


@pytest.mark.parametrize("keyed", [False, True])
def test_archive_is_the_deleting_completion_plus_one_insert_of_the_rows_it_deleted(keyed):
    deleting = completion_statements(COMPLETED_DELETE)[keyed]
    archived = completion_statements(COMPLETED_ARCHIVE)[keyed]
    assert "dispatcher_jobs_archive" not in deleting
    assert archived.count("INSERT INTO dispatcher_jobs_archive") == 1
    assert archived.count("DELETE FROM dispatcher_jobs AS j") == 1
    cte = "released" if keyed else "done"
    assert f"FROM {cte} AS m" in archived and "RETURNING j.*" in archived
    # Everything the deleting completion does, it still does: only the RETURNING list widened.
    removed = [line for line in deleting.splitlines() if line not in archived.splitlines()]
    assert len(removed) == 1 and removed[0].lstrip().startswith("RETURNING j.")
    assert "{" not in archived


def test_keep_and_delete_do_not_touch_the_archive():
    for completed in (COMPLETED_KEEP, COMPLETED_DELETE):
        for text in completion_statements(completed).values():
            assert "dispatcher_jobs_archive" not in text


def test_a_completion_that_changed_shape_is_refused_not_half_archived():
    with pytest.raises(ValueError, match="changed shape"):
        archiving(completion_statements(COMPLETED_KEEP)[False])  # an UPDATE: nothing to move
    with pytest.raises(ValueError, match="changed shape"):
        archiving("SELECT 1")


def test_on_a_cluster_the_archiving_completions_are_pinned_to_one_bucket():
    statements = ShardedStatements(
        None,  # type: ignore[arg-type]  # no statement runs here
        "w",
        query("jobs_complete_owned_delete"),
        "channel",
        archive=True,
    )
    for text in (statements._complete_sql, statements._keyed_sql):
        assert "INSERT INTO dispatcher_jobs_archive" in text
        assert "j.bucket = %(bucket)s::smallint AND j.id = ANY(%(ids)s::bigint[])" in text
