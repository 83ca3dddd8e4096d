import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from coordinator.buckets import NUM_BUCKETS
from dispatcher.db.migrate import MIGRATION_PACKAGES, available_migrations, current_version, migrate
from dispatcher.errors import MigrationError
from tests.helpers import ROOT, fetchall, fetchval


def test_migrate_is_idempotent(empty_dsn):
    assert current_version(empty_dsn) is None
    assert migrate(empty_dsn) == [m.version for m in available_migrations()]
    assert migrate(empty_dsn) == []
    assert current_version(empty_dsn) == available_migrations()[-1].version


def test_the_migrate_command_prints_each_migration_it_applied(empty_dsn):
    """One line per migration, none suppressed: distinct one-off lines of one template are not
    a storm (dispatcher/observe/ratelimit.py)."""
    result = subprocess.run(
        [sys.executable, "-m", "dispatcher", "migrate", "--dsn", empty_dsn],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "applying migration" in line]
    expected = [f"{m.package}/{m.version:04d}_{m.name}" for m in available_migrations()]
    assert [line.rsplit("applying migration ", 1)[1] for line in lines] == expected
    assert "suppressed" not in result.stderr
    versions = [m.version for m in available_migrations()]
    assert f"applied migrations: {versions}" in result.stdout


def test_eight_pods_migrating_at_once_apply_each_version_once(empty_dsn):
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: migrate(empty_dsn), range(8)))
    applied = [r for r in results if r]
    assert len(applied) == 1, results  # exactly one runner did the work; the others found it done
    rows = fetchall(
        empty_dsn, "SELECT version, count(*) FROM dispatcher_schema_version GROUP BY version"
    )
    assert all(count == 1 for _, count in rows)
    assert fetchval(empty_dsn, "SELECT to_regclass('dispatcher_jobs') IS NOT NULL")


def test_jobs_table_has_high_churn_storage_settings(dsn):
    options = fetchval(dsn, "SELECT reloptions FROM pg_class WHERE relname = 'dispatcher_jobs'")
    assert "fillfactor=70" in options
    assert "autovacuum_vacuum_scale_factor=0.01" in options


def test_both_packages_migrations_apply_as_one_sequence(empty_dsn):
    """dispatcher's and coordinator's migrations interleave by version into one history, with the
    same versions and names as when all of them lived in dispatcher/ (so such a database is
    already up to date)."""
    own = {pkg: available_migrations((pkg,)) for pkg in MIGRATION_PACKAGES}
    assert all(own.values()), own  # each package ships some
    union = sorted((m for ms in own.values() for m in ms), key=lambda m: m.version)
    assert [m.version for m in available_migrations()] == [m.version for m in union]
    assert migrate(empty_dsn) == [m.version for m in union]
    history = fetchall(
        empty_dsn, "SELECT version, name FROM dispatcher_schema_version ORDER BY version"
    )
    assert history == [(m.version, m.name) for m in union]
    assert history[:3] == [(1, "jobs"), (2, "coordinator"), (3, "claim_index_tag")]
    assert [m.version for m in own["coordinator"]] == [2, 5]
    assert fetchval(empty_dsn, "SELECT to_regclass('dispatcher_bucket_owners') IS NOT NULL")


def test_coordinator_bucket_table_covers_exactly_the_bucket_space(dsn):
    assert fetchall(
        dsn, "SELECT count(*), min(bucket), max(bucket) FROM dispatcher_bucket_owners"
    ) == [(NUM_BUCKETS, 0, NUM_BUCKETS - 1)]
    with pytest.raises(psycopg.errors.CheckViolation):
        fetchall(dsn, "INSERT INTO dispatcher_bucket_owners (bucket) VALUES (%s)", (NUM_BUCKETS,))


def test_a_version_used_by_two_packages_is_refused_before_anything_runs(
    empty_dsn, tmp_path, monkeypatch
):
    package = f"clashing_migrations_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / package / "sql" / "migrations"
    folder.mkdir(parents=True)
    (tmp_path / package / "__init__.py").write_text("")
    (folder / "0002_other.sql").write_text("CREATE TABLE must_not_exist (id int);")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MigrationError, match="share version 2"):
        available_migrations(("dispatcher.db", "coordinator", package))
    with pytest.raises(MigrationError, match="share version 2"):
        migrate(empty_dsn, (*MIGRATION_PACKAGES, package))
    assert current_version(empty_dsn) is None  # nothing ran, not even the version table
