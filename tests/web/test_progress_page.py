"""A job's progress and metadata on the dashboard's job page over plain HTTP: shown, as JSON, once
its handler reported them, escaped when they hold markup, and absent from a job that reported
nothing."""

from __future__ import annotations

import html
import re

import orjson
import psycopg
from psycopg.types.json import Jsonb

from dispatcher.api.enqueue import enqueue_sync
from tests.web.support import HOSTILE, Client, served


def test_the_job_page_shows_what_its_handler_reported_escaped(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        reported = enqueue_sync(conn, "import")
        silent = enqueue_sync(conn, "import")
        # As a worker's jobs_report_progress leaves them (markup is valid JSON text).
        conn.execute(
            "UPDATE dispatcher_jobs SET status = 'running', progress = %s, meta = %s WHERE id = %s",
            (Jsonb({"done": 3, "total": 4}), Jsonb({"source": HOSTILE, "rows": 3}), reported),
        )
    with served(dsn) as web:
        client = Client(web.url)
        status, _, page = client.request(f"/jobs/{reported}")
        assert status == 200
        progress = re.search(r'<pre class="payload" id="progress">(.*?)</pre>', page, re.S)
        meta = re.search(r'<pre class="payload" id="meta">(.*?)</pre>', page, re.S)
        assert progress and meta, page[-2000:]
        assert orjson.loads(html.unescape(progress[1])) == {"done": 3, "total": 4}
        assert orjson.loads(html.unescape(meta[1])) == {"source": HOSTILE, "rows": 3}
        assert "<script>window" not in page and "<img src=x" not in page
        page = client.request(f"/jobs/{silent}")[2]
        assert 'id="progress"' not in page and 'id="meta"' not in page
