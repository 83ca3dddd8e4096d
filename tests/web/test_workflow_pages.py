"""A job's parents, batch and result on the dashboard's job page over plain HTTP, and the same in
`dispatcher jobs show` and `jobs list --batch`: shown once there, escaped when they hold markup."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys

import orjson
import psycopg
from psycopg.types.json import Jsonb

from dispatcher import JobSpec, enqueue_batch_sync, enqueue_sync
from tests.web.support import HOSTILE, Client, served


def test_the_job_page_shows_parents_batch_and_result_escaped(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        parent = enqueue_sync(conn, "a")
        child = enqueue_sync(conn, "b", depends_on=[parent])
        batch = enqueue_batch_sync(conn, [JobSpec("m")], JobSpec("report"))
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'completed', result = %s WHERE id = %s",
            (Jsonb({"html": HOSTILE}), parent),
        )
    with served(dsn) as web:
        client = Client(web.url)
        page = client.request(f"/jobs/{child}")[2]
        parents = re.search(r'<td id="job-parents">(.*?)</td>', page, re.S)
        assert parents and f'href="/jobs/{parent}"' in parents[1] and "waiting for 1" in parents[1]
        page = client.request(f"/jobs/{parent}")[2]
        result = re.search(r'<pre class="payload" id="result">(.*?)</pre>', page, re.S)
        assert result and orjson.loads(html.unescape(result[1])) == {"html": HOSTILE}
        assert "<script>window" not in page and "<img src=x" not in page
        page = client.request(f"/jobs/{batch.job_ids[0]}")[2]
        member = re.search(r'<td id="job-batch">(.*?)</td>', page, re.S)
        assert member and f'href="/jobs/{batch.batch_id}"' in member[1]
        page = client.request(f"/jobs/{child}")[2]
        assert 'id="result"' not in page and 'id="job-batch"' not in page


def dispatcher(dsn: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_jobs_show_and_list_by_batch(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        batch = enqueue_batch_sync(conn, [JobSpec("m"), JobSpec("m")], JobSpec("report"))
        other = enqueue_sync(conn, "m")
        child = enqueue_sync(conn, "b", depends_on=[batch.job_ids[0]])
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'completed', result = %s WHERE id = %s",
            (Jsonb({"rows": 3}), other),
        )
    listed = json.loads(dispatcher(dsn, "jobs", "list", "--batch", str(batch.batch_id), "--json"))
    assert sorted(j["id"] for j in listed) == sorted([*batch.job_ids, batch.batch_id])
    shown = dispatcher(dsn, "jobs", "show", str(other))
    assert '  result               {"rows":3}' in shown
    shown = json.loads(dispatcher(dsn, "jobs", "show", str(child), "--json"))
    assert (shown["job"]["depends_on"], shown["job"]["pending_parents"]) == ([batch.job_ids[0]], 1)
    assert shown["job"]["status"] == "blocked"
