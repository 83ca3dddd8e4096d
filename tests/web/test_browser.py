"""The dashboard in a real browser: Debian's chromium, driven by selenium through Debian's
chromedriver (both given by path, SE_OFFLINE set: nothing is downloaded), against a real
PostgreSQL with jobs in every status and two real workers of the PostgreSQL coordinator.

Every page loads with no console error (a CSP violation is one); retry, cancel and a bulk retry
are clicked and the rows checked in the database; a job whose payload and error carry script runs
none of it; a page picks up a new job by itself without reloading. With
DISPATCHER_SCREENSHOTS=<dir>, each page is saved there as PNG (docs/images holds the ones the
guide shows: `DISPATCHER_SCREENSHOTS=docs/images pytest tests/web/test_browser.py`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatcher.api.enqueue import enqueue_sync
from tests.databases import scratch_database
from tests.helpers import fetchval, start_worker, stop_workers, wait_until
from tests.web.support import MARK, SEEDED, Seeded, seed, served, statuses

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = os.environ.get("DISPATCHER_SCREENSHOTS")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
        reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
    ),
]


@pytest.fixture(scope="module")
def world(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Seeded]]:
    """A database with the seeded jobs, and two live workers serving `default` with three jobs
    that run until they stop (the workers page and the bucket map have owners to show)."""
    tmp = tmp_path_factory.mktemp("web")
    with scratch_database(pg_admin_dsn, "dispatcher_web", template=template_db) as dsn:
        seeded = seed(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(3):
                enqueue_sync(conn, "hold", {"s": 3600}, partition_key=f"p{i}")
        workers = [
            start_worker(
                dsn,
                app="tests.apps.probes:registry",
                log_path=tmp / f"w{i}.log",
                worker_id=f"web-worker-{i}",
                lease_s=30,
                shutdown_grace_s=1,
            )
            for i in range(2)
        ]
        try:
            wait_until(
                lambda: (
                    fetchval(
                        dsn,
                        "SELECT count(*) FROM dispatcher_jobs WHERE status = 'running' "
                        "AND queue_name = 'default'",
                    )
                    == 3
                ),
                60,
                "the hold jobs running",
            )
            wait_until(
                lambda: (
                    fetchval(
                        dsn,
                        "SELECT count(DISTINCT owner) FROM dispatcher_bucket_owners "
                        "WHERE queue = 'default' AND owner IS NOT NULL",
                    )
                    == 2
                ),
                60,
                "both workers owning buckets",
            )
            yield dsn, seeded
        finally:
            stop_workers(workers, timeout_s=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must never fetch a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1360,900",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def web(world: tuple[str, Seeded]) -> Iterator[str]:
    dsn, _ = world
    with served(dsn, web_allow_actions=True) as server:
        yield server.url


def visit(browser: Any, url: str, heading: str, shot: str | None = None) -> None:
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(url)
    wait_until(
        lambda: browser.execute_script("return document.readyState") == "complete",
        30,
        f"{url} loaded",
    )
    assert heading in browser.find_element(By.TAG_NAME, "h1").text, (url, browser.page_source[:500])
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"{url}: console errors {errors}"
    if SHOTS and shot:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SHOTS) / f"dashboard-{shot}.png"))


def test_every_page_loads_without_a_console_error(browser, web, world):
    from selenium.webdriver.common.by import By

    _, s = world
    visit(browser, web + "/", "Queues", "overview")
    queues = [
        r.get_attribute("data-queue")
        for r in browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
    ]
    assert {"default", SEEDED} <= set(queues)
    visit(browser, f"{web}/jobs?queue={SEEDED}", "Jobs", "jobs")
    visit(browser, f"{web}/jobs/{s.ids['failed'][0]}", f"Job {s.ids['failed'][0]}", "job")
    assert "RuntimeError: smtp timeout" in browser.find_element(By.ID, "last-error").text
    visit(browser, web + "/workers", "Workers", "workers")
    members = [
        r.get_attribute("data-member")
        for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-member]")
    ]
    assert sorted(members) == ["web-worker-0", "web-worker-1"]
    visit(browser, web + "/buckets?queue=default", "Bucket map", "buckets")
    cells = browser.find_elements(By.CSS_SELECTOR, "#bucket-grid .cell")
    assert len(cells) == 64
    colours = {
        c
        for cell in cells
        for c in cell.get_attribute("class").split()
        if c[:1] == "o" and c[1:].isdigit()
    }
    assert len(colours) == 2, "each bucket coloured by one of the two owners"
    visit(browser, web + "/flow", "Limits", "flow")


def test_the_charts_render_with_data_and_without(browser, web, world):
    """The overview's and a queue's charts draw their lines from the rollup (rows written here as
    the rollup would, and the live workers' own flushes), a queue with none says so, both spans
    render, and a live refresh redraws them: no console error anywhere."""
    from selenium.webdriver.common.by import By

    dsn, _ = world
    with psycopg.connect(dsn, autocommit=True) as conn:
        # 50 minutes as the rollup writes them: a backlog that builds, then drains; the waits
        # a histogram over WAIT_BUCKETS_S (its 21 buckets) that moves with the backlog.
        minutes = []
        for m in range(1, 51):
            depth = max(0, 400 - abs(m - 25) * 16)
            waits = [0] * 21
            waits[4 + min(6, depth // 70)] = 30 + m % 7
            waits[7 + min(5, depth // 80)] = 2
            for q in (SEEDED, ""):
                minutes.append((m, q, 60 + (m * 37) % 25, m % 4, waits, depth))
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO dispatcher_stats_by_minute"
                " (minute, queue_name, finished, failed, waits, depth)"
                " VALUES (date_trunc('minute', now()) - %s * interval '1 minute', %s, %s, %s,"
                "         %s, %s)"
                " ON CONFLICT DO NOTHING",
                minutes,
            )

    def drawn() -> dict[str, int]:
        return {
            f.get_attribute("id"): len(f.find_elements(By.CSS_SELECTOR, "polyline"))
            for f in browser.find_elements(By.CSS_SELECTOR, "figure.chart")
            if f.get_attribute("data-empty") == "false"
        }

    visit(browser, f"{web}/queues/{SEEDED}", f"Queue {SEEDED}", "queue")
    assert drawn()["chart-throughput"] == 2 and drawn()["chart-depth"] >= 1
    title = browser.find_element(By.CSS_SELECTOR, "#chart-throughput svg title")
    assert title.get_attribute("textContent").startswith("Finished and failed")
    visit(browser, web + "/?span=24h", "Queues")
    assert drawn()["chart-throughput"] == 2
    visit(browser, web + "/", "Queues", "overview-charts")
    refreshed = browser.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed")
    wait_until(
        lambda: (
            browser.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed") != refreshed
        ),
        30,
        "a live refresh",
        interval_s=0.5,
    )
    assert drawn()["chart-throughput"] == 2
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"console errors {errors}"
    visit(browser, f"{web}/queues/no-such-queue", "Queue no-such-queue")
    figures = browser.find_elements(By.CSS_SELECTOR, "figure.chart")
    assert len(figures) == 3 and all(f.get_attribute("data-empty") == "true" for f in figures)
    assert "no data in this span yet" in figures[0].text
    assert not browser.find_elements(By.CSS_SELECTOR, "figure.chart polyline")


def test_the_bucket_map_shows_each_buckets_backlog(browser, web, world):
    from selenium.webdriver.common.by import By

    dsn, _ = world
    with psycopg.connect(dsn, autocommit=True) as conn:
        due = dict(
            conn.execute(
                "SELECT bucket, count(*) FROM dispatcher_jobs WHERE queue_name = %s "
                "AND status = 'queued' AND run_at <= now() GROUP BY bucket",
                (SEEDED,),
            ).fetchall()
        )
    visit(browser, f"{web}/buckets?queue={SEEDED}", "Bucket map")
    shown = {
        int(c.get_attribute("data-bucket")): int(c.get_attribute("data-due"))
        for c in browser.find_elements(By.CSS_SELECTOR, "#bucket-grid .cell")
    }
    assert shown == {b: due.get(b, 0) for b in range(64)}


def test_a_job_whose_payload_and_error_hold_script_runs_none_of_it(browser, web, world):
    from selenium.webdriver.common.by import By

    _, s = world
    for url in (f"{web}/jobs/{s.hostile}", f"{web}/jobs?queue={SEEDED}&type=evil"):
        visit(browser, url, "Job" if "/jobs/" in url else "Jobs")
        assert browser.execute_script(f"return window.{MARK}") is None, url
        assert browser.title != "pwned"
        assert not browser.find_elements(By.CSS_SELECTOR, "main img, main script"), (
            "no element made from data"
        )
    visit(browser, f"{web}/jobs/{s.hostile}", "Job")
    assert "<script>window" in browser.find_element(By.ID, "payload").text, (
        "the payload is shown as text"
    )


def test_retry_and_cancel_buttons_change_the_rows(browser, web, world):
    from selenium.webdriver.common.by import By

    dsn, s = world
    failed, queued = s.ids["failed"][1], s.ids["queued"][1]
    visit(browser, f"{web}/jobs/{failed}", f"Job {failed}")
    browser.find_element(By.ID, "action-retry").click()
    wait_until(lambda: browser.find_elements(By.ID, "done"), 30, "the retry's message")
    assert "Retried" in browser.find_element(By.ID, "done").text
    assert statuses(dsn, [failed]) == {failed: "queued"}
    assert browser.find_element(By.ID, "job-status").text == "queued"
    visit(browser, f"{web}/jobs/{queued}", f"Job {queued}")
    browser.find_element(By.ID, "action-cancel").click()
    wait_until(lambda: browser.find_elements(By.ID, "done"), 30, "the cancel's message")
    assert statuses(dsn, [queued]) == {queued: "cancelled"}


def test_a_bulk_retry_shows_the_count_then_retries_exactly_those(browser, web, world):
    from selenium.webdriver.common.by import By

    dsn, _s = world
    with psycopg.connect(dsn, autocommit=True) as conn:
        discarded = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM dispatcher_jobs WHERE queue_name = %s AND status = 'discarded'",
                (SEEDED,),
            )
        ]
    visit(browser, f"{web}/jobs?queue={SEEDED}&status=discarded", "Jobs")
    browser.find_element(By.ID, "bulk-retry").click()
    wait_until(lambda: browser.find_elements(By.ID, "matching"), 30, "the confirmation page")
    assert browser.find_element(By.CSS_SELECTOR, "#matching strong").text == str(len(discarded))
    assert set(statuses(dsn, discarded).values()) == {"discarded"}, (
        "nothing changed before the confirmation"
    )
    if SHOTS:
        browser.save_screenshot(str(Path(SHOTS) / "dashboard-confirm.png"))
    browser.find_element(By.ID, "confirm").click()
    wait_until(lambda: browser.find_elements(By.ID, "result"), 30, "the result page")
    assert f"{len(discarded)} changed" in browser.find_element(By.ID, "result").text
    assert set(statuses(dsn, discarded).values()) == {"queued"}


def test_a_page_shows_a_new_job_by_itself_without_reloading(browser, web, world):
    from selenium.webdriver.common.by import By

    dsn, _ = world
    visit(browser, f"{web}/jobs?queue={SEEDED}", "Jobs")
    browser.execute_script("window.__sameDocument = 'yes'")
    with psycopg.connect(dsn, autocommit=True) as conn:
        new_id = enqueue_sync(conn, "report.build", {"late": True}, queue=SEEDED)
    wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{new_id}"]'),
        30,
        "the new job on the page",
        interval_s=0.5,
    )
    assert browser.execute_script("return window.__sameDocument") == "yes", (
        "refreshed in place, not reloaded"
    )
    assert "updated" in browser.find_element(By.ID, "updated").text


def test_a_job_found_by_payload_search_is_retried_from_its_row(browser, web, world):
    """Search by payload, tick the row (the page then stops refreshing, so the tick stays), retry
    the selection: that job is queued again and no other row changed."""
    from selenium.webdriver.common.by import By

    dsn, _ = world
    with psycopg.connect(dsn, autocommit=True) as conn:
        target = enqueue_sync(conn, "ship", {"order": 8812, "customer": {"id": 5}}, queue=SEEDED)
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'failed', attempts = 1, failed_at = now(), "
            "last_error = 'KeyError: warehouse' WHERE id = %s",
            (target,),
        )
    visit(browser, f"{web}/jobs", "Jobs")
    browser.find_element(By.ID, "search-payload").send_keys("order=8812 customer.id=5")
    browser.find_element(By.ID, "search").click()
    wait_until(lambda: browser.find_elements(By.ID, "searched"), 30, "the search's page")
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert [r.get_attribute("data-job-id") for r in rows] == [str(target)]
    assert "Searched ids" in browser.find_element(By.ID, "searched").text
    box = browser.find_element(By.CSS_SELECTOR, f'input[name="id"][value="{target}"]')
    box.click()
    with psycopg.connect(dsn, autocommit=True) as conn:  # a refresh would show it, and untick
        later = enqueue_sync(conn, "ship", {"order": 8812, "customer": {"id": 5}}, queue=SEEDED)
    wait_until(
        lambda: "paused" in browser.find_element(By.ID, "updated").text,
        30,
        "a refresh held back while a row is ticked",
        interval_s=0.5,
    )
    assert browser.find_element(
        By.CSS_SELECTOR, f'input[name="id"][value="{target}"]'
    ).is_selected()
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{later}"]')
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SHOTS) / "dashboard-search.png"))
    before = statuses_of_all(dsn)
    browser.find_element(By.ID, "selected-retry").click()
    wait_until(lambda: browser.find_elements(By.ID, "outcomes"), 30, "the result page")
    outcome = browser.find_element(By.CSS_SELECTOR, f'#outcomes tr[data-job-id="{target}"]')
    assert outcome.get_attribute("data-outcome") == "changed"
    after = statuses_of_all(dsn)
    assert {i: s for i, s in after.items() if before.get(i) != s} == {target: "queued"}
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"console errors {errors}"
    # Unticked, the page refreshes again: the job enqueued meanwhile shows up.
    visit(browser, f"{web}/jobs?payload=order%3D8812+customer.id%3D5", "Jobs")
    box = browser.find_element(By.ID, "select-all")
    box.click()
    assert all(b.is_selected() for b in browser.find_elements(By.NAME, "id"))
    box.click()
    with psycopg.connect(dsn, autocommit=True) as conn:
        newest = enqueue_sync(conn, "ship", {"order": 8812, "customer": {"id": 5}}, queue=SEEDED)
    wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{newest}"]'),
        30,
        "the refresh going on once nothing is ticked",
        interval_s=0.5,
    )


def statuses_of_all(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT id, status FROM dispatcher_jobs").fetchall())
