"""docs/examples/django_app against a real PostgreSQL: enqueue inside `transaction.atomic` on
Django's own connection (the job exists if and only if the block commits), and a real
`dispatcher run` worker, started as docs/guides/integrations.md says, whose handler uses the ORM."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.devtools import harness
from tests.databases import scratch_database
from tests.helpers import ROOT, fetchall, stop_workers, wait_until

django = pytest.importorskip("django", reason="Django is in the `test` extra")

APP_DIR = ROOT / "docs" / "examples" / "django_app"


@pytest.fixture(scope="module")
def django_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """One database for the module, with the dispatcher's tables and the example's: Django is set
    up once per process, on the example's own settings module."""
    with (
        scratch_database(pg_admin_dsn, "dispatcher_django", template=template_db) as dsn,
        pytest.MonkeyPatch.context() as path,
    ):
        path.syspath_prepend(str(APP_DIR))
        with pytest.MonkeyPatch.context() as env:  # read once, by django.setup()
            env.setenv("DATABASE_URL", dsn)
            env.setenv("DJANGO_SETTINGS_MODULE", "shop.settings")
            django.setup()
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", run_syncdb=True, verbosity=0)  # the example's table, from its model
        try:
            yield dsn
        finally:
            connections.close_all()


def jobs_of(dsn: str, order_id: int) -> list[tuple[Any, ...]]:
    return fetchall(
        dsn,
        "SELECT job_type, status FROM dispatcher_jobs WHERE payload->>'order_id' = %s",
        (str(order_id),),
    )


def test_the_order_and_its_job_commit_together(django_dsn: str) -> None:
    from shop.models import Order
    from shop.orders import place_order

    order = place_order("ada@example.com", 1200)
    assert Order.objects.filter(pk=order.pk).exists()
    assert jobs_of(django_dsn, order.pk) == [("send_receipt", "queued")]


def test_an_order_rolled_back_leaves_no_job(django_dsn: str) -> None:
    from django.db import transaction
    from shop.models import Order
    from shop.orders import place_order

    with pytest.raises(RuntimeError, match="payment declined"), transaction.atomic():
        order = place_order("grace@example.com", 990)
        # written, not committed: other sessions see nothing
        assert jobs_of(django_dsn, order.pk) == []
        raise RuntimeError("payment declined")
    assert not Order.objects.filter(pk=order.pk).exists()
    assert jobs_of(django_dsn, order.pk) == []


@pytest.mark.slow
def test_a_worker_started_as_the_guide_says_runs_the_orm_handler(
    django_dsn: str, tmp_path: Any
) -> None:
    from shop.models import Order
    from shop.orders import place_order

    order = place_order("alan@example.com", 4200)
    log = tmp_path / "worker.log"
    # DISPATCHER_DSN=$DATABASE_URL dispatcher run --app shop.jobs:registry, from the project's
    # directory (no DJANGO_SETTINGS_MODULE: shop/jobs.py sets its default, as manage.py does).
    assert "DJANGO_SETTINGS_MODULE" not in os.environ
    worker = harness.start_worker(
        django_dsn,
        "shop.jobs:registry",
        log=log,
        cwd=APP_DIR,
        extra_env={"DATABASE_URL": django_dsn, "PYTHONPATH": str(ROOT)},
        poll_interval_s=0.1,
    )
    try:
        wait_until(
            lambda: (
                Order.objects.get(pk=order.pk).receipt_sent_at is not None
                or worker.poll() is not None
            ),
            30,
            "the receipt sent by the worker",
        )
    finally:
        codes = stop_workers([worker])
    assert codes == [0], log.read_text()
    assert Order.objects.get(pk=order.pk).receipt_sent_at is not None, log.read_text()
    assert jobs_of(django_dsn, order.pk) == [("send_receipt", "completed")]
