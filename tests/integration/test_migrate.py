from concurrent.futures import ThreadPoolExecutor

from dispatcher.migrate import available_migrations, current_version, migrate
from tests.helpers import fetchall, fetchval


def test_migrate_is_idempotent(empty_dsn):
    assert current_version(empty_dsn) is None
    assert migrate(empty_dsn) == [m.version for m in available_migrations()]
    assert migrate(empty_dsn) == []
    assert current_version(empty_dsn) == available_migrations()[-1].version


def test_eight_pods_migrating_at_once_apply_each_version_once(empty_dsn):
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: migrate(empty_dsn), range(8)))
    applied = [r for r in results if r]
    assert len(applied) == 1, results  # exactly one runner did the work; the others found it done
    rows = fetchall(empty_dsn, "SELECT version, count(*) FROM dispatcher_schema_version GROUP BY version")
    assert all(count == 1 for _, count in rows)
    assert fetchval(empty_dsn, "SELECT to_regclass('dispatcher_jobs') IS NOT NULL")


def test_jobs_table_has_high_churn_storage_settings(dsn):
    options = fetchval(dsn, "SELECT reloptions FROM pg_class WHERE relname = 'dispatcher_jobs'")
    assert "fillfactor=70" in options
    assert "autovacuum_vacuum_scale_factor=0.01" in options
