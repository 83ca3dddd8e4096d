import ast
import re
from importlib import resources
from pathlib import Path

import pytest

from coordinator.pg.sqlfile import load_all, parse_named_queries
from dispatcher.constants import NUM_BUCKETS
from dispatcher.db.migrate import available_migrations
from dispatcher.db.store import claim_sql


def test_every_query_parses_and_has_no_leftover_comment_lines():
    queries = load_all("dispatcher.db")
    assert {
        "jobs_claim",
        "claim_select_partitioned",
        "claim_select_skip_locked",
        "jobs_complete_owned",
    } <= set(queries)
    for name, text in queries.items():
        assert text and not text.lstrip().startswith("--"), name


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="twice"):
        parse_named_queries("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


def test_schema_bucket_check_matches_the_constant():
    schema = available_migrations()[0].sql
    low, high = map(int, re.search(r"bucket BETWEEN (\d+) AND (\d+)", schema).groups())
    assert (low, high) == (0, NUM_BUCKETS - 1)


def test_partitioned_claim_has_one_ordered_branch_per_bucket():
    text = claim_sql((5, 1, 5, 9))
    assert text.count("UNION ALL") == 2
    for bucket in (1, 5, 9):
        assert f"bucket = {bucket} AND" in text
    assert "{" not in text


def test_owning_every_bucket_claims_through_one_index_walk():
    text = claim_sql(range(64))
    assert (
        "UNION ALL" not in text
        and "SKIP LOCKED" not in text
        and "bucket" not in text.split("RETURNING")[0]
    )


def test_a_claim_window_reads_its_buckets_and_takes_the_others_as_a_parameter():
    """One text per window (its buckets inlined, as a partitioned claim's), whatever the rest of
    the owned set; the veto and the `outranked` column only in a window's statement."""
    text = claim_sql((9, 1), window=True)
    assert text.count("UNION ALL") == 1
    assert "bucket = 1 AND" in text and "bucket = 9 AND" in text and "{" not in text
    assert "%(outside)s" in text and text.split("FROM picked AS p")[0].rstrip().endswith(
        "outranked"
    )
    plain = claim_sql((1, 9))
    assert "outside" not in plain and "outranked" not in plain
    assert claim_sql(range(64), window=True).count("UNION ALL") == 63
    with pytest.raises(ValueError, match="set of buckets"):
        claim_sql(None, window=True)


@pytest.mark.parametrize("bad", [(), (64,), (-1,), ("1; DROP TABLE x",)])
def test_partitioned_claim_refuses_bad_buckets(bad):
    with pytest.raises(ValueError):
        claim_sql(bad)


def test_migrations_ship_with_the_package():
    names = [
        p.name for p in resources.files("dispatcher.db").joinpath("sql", "migrations").iterdir()
    ]
    assert "0001_jobs.sql" in names


def test_every_query_file_is_loaded_and_a_name_in_two_files_is_refused(tmp_path, monkeypatch):
    sql = tmp_path / "twofiles" / "sql"
    sql.mkdir(parents=True)
    (tmp_path / "twofiles" / "__init__.py").write_text("")
    (sql / "a.sql").write_text("-- name: one\nSELECT 1\n")
    (sql / "b.sql").write_text("-- name: two\nSELECT 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_all("twofiles") == {"one": "SELECT 1", "two": "SELECT 2"}
    (sql / "c.sql").write_text("-- name: one\nSELECT 3\n")
    load_all.cache_clear()
    with pytest.raises(ValueError, match=re.escape("'one' is defined in both a.sql and c.sql")):
        load_all("twofiles")
    load_all.cache_clear()


def test_the_named_queries_are_split_by_concern():
    files = {
        p.name
        for p in resources.files("dispatcher.db").joinpath("sql").iterdir()
        if p.name.endswith(".sql")
    }
    assert {
        "claim.sql",
        "finish.sql",
        "maintenance.sql",
        "admin.sql",
        "enqueue.sql",
        "observe.sql",
    } <= files
    assert "queries.sql" not in files


_STATEMENT = re.compile(
    r"^\s*(?:(?:SELECT|INSERT|UPDATE|DELETE|WITH|TRUNCATE|LOCK|CREATE|ALTER|DROP|GRANT|REVOKE|"
    r"SET|ANALYZE|VACUUM|BEGIN|COMMIT)\s|(?:UN)?LISTEN\s+\S+\s*$|NOTIFY\s+\S+\s*(?:,|$))"
)


def sql_literals(source: str) -> list[tuple[int, str]]:
    """(line, start) of every string literal in `source` that begins like a SQL statement;
    docstrings are prose and left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value[:40])
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and _STATEMENT.match(node.value)
    ]


@pytest.mark.parametrize(
    "source, found",
    [
        ('conn.execute("SELECT 1")', True),
        ('q = """\n    UPDATE dispatcher_jobs SET x = 1"""', True),
        ('conn.execute(f"LOCK TABLE {name}")', True),
        ('def f():\n    """SELECT the jobs: prose."""', False),
        ('TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"', False),
        ('help = "most rows one DELETE of the pruner takes"', False),
        ('conn.execute("LISTEN dispatcher_jobs")', True),
        ('log.info("LISTEN is off (listen_dsn=none): idle workers poll")', False),
    ],
)
def test_the_inline_sql_check_tells_statements_from_prose(source, found):
    assert bool(sql_literals(source)) is found


def test_no_python_module_of_the_package_holds_a_sql_statement():
    """Every statement lives in a named-query file (dispatcher/db/sql, coordinator/sql,
    dispatcher/devtools/sql), where pg_stat_statements tooling and reviewers find it."""
    root = Path(__file__).resolve().parents[2]
    found = {
        str(p.relative_to(root)): hits
        for top in ("dispatcher", "coordinator")
        for p in (root / top).rglob("*.py")
        if (hits := sql_literals(p.read_text(encoding="utf-8")))
    }
    assert found == {}
