"""docs/examples/fastapi_app.py under a real uvicorn against a real PostgreSQL: POST /signup
writes the user and its job in one transaction through the app's pool; with RUN_WORKER=1, the
worker in the app's lifespan runs the job, and stops with the server; without it, a `dispatcher run`
process beside the app runs the app's registry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatcher.devtools import harness
from tests.helpers import ROOT, fetchall, fetchval, free_port, http_get, stop_workers, wait_until

pytest.importorskip("fastapi", reason="FastAPI is in the `test` extra")
pytest.importorskip("uvicorn", reason="uvicorn is in the `web` extra")

EXAMPLES = ROOT / "docs" / "examples"
USERS = (
    "CREATE TABLE users (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
    "email text NOT NULL UNIQUE)"
)


class Server:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())

    def stop(self) -> str:
        """SIGTERM, as a deployment stops it: uvicorn runs the lifespan's shutdown, then exits by
        the signal it caught (-SIGTERM; older versions exit 0). Returns the server's log."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"uvicorn did not stop within 30 s:\n{self.log.read_text()}"
            ) from None
        log = self.log.read_text()
        assert code in (0, -signal.SIGTERM), log
        assert "Application shutdown complete" in log and "Traceback" not in log, log
        return log


@pytest.fixture
def serve(dsn: str, tmp_path: Path) -> Iterator[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(USERS)
    servers: list[Server] = []

    def start(**env: str) -> Server:
        port, log = free_port(), tmp_path / f"uvicorn{len(servers)}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
        environ.update(DATABASE_URL=dsn, PYTHONPATH=str(ROOT), **env)
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "fastapi_app:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                cwd=EXAMPLES,
                env=environ,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = Server(process, port, log)
        servers.append(server)
        wait_until(
            lambda: process.poll() is not None or http_get(port, "/openapi.json") is not None,
            30,
            "uvicorn answering",
        )
        assert process.poll() is None, log.read_text()
        return server

    try:
        yield start
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait()


def test_signup_writes_the_user_and_its_job(dsn: str, serve: Any) -> None:
    server = serve()
    status, body = server.post("/signup", {"email": "ada@example.com"})
    assert status == 201
    assert (
        fetchval(dsn, "SELECT email FROM users WHERE id = %s", (body["id"],)) == "ada@example.com"
    )
    assert fetchall(dsn, "SELECT job_type, payload, status FROM dispatcher_jobs") == [
        ("send_welcome", {"user_id": body["id"], "email": "ada@example.com"}, "queued")
    ]
    server.stop()


@pytest.mark.slow
def test_the_lifespan_worker_runs_the_job_and_stops_with_the_server(dsn: str, serve: Any) -> None:
    server = serve(RUN_WORKER="1")
    status, body = server.post("/signup", {"email": "grace@example.com"})
    assert status == 201

    def status_of_job() -> Any:
        assert server.process.poll() is None, server.log.read_text()
        return fetchval(
            dsn,
            "SELECT status FROM dispatcher_jobs WHERE payload->>'user_id' = %s",
            (str(body["id"]),),
        )

    wait_until(lambda: status_of_job() == "completed", 30, "the welcome job completed")
    server.stop()  # the lifespan stopped the worker: a clean shutdown, no traceback


@pytest.mark.slow
def test_dispatcher_run_beside_the_app_runs_the_job(dsn: str, serve: Any, tmp_path: Path) -> None:
    server = serve()
    status, body = server.post("/signup", {"email": "alan@example.com"})
    assert status == 201
    log = tmp_path / "worker.log"
    # DISPATCHER_DSN=$DATABASE_URL dispatcher run --app fastapi_app:registry, from the app's
    # directory
    worker = harness.start_worker(
        dsn,
        "fastapi_app:registry",
        log=log,
        cwd=EXAMPLES,
        extra_env={"DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_until(
            lambda: (
                worker.poll() is not None
                or fetchval(
                    dsn,
                    "SELECT status FROM dispatcher_jobs WHERE payload->>'user_id' = %s",
                    (str(body["id"]),),
                )
                == "completed"
            ),
            30,
            "the welcome job completed by `dispatcher run`",
        )
    finally:
        codes = stop_workers([worker])
    assert codes == [0], log.read_text()
    assert fetchval(dsn, "SELECT status FROM dispatcher_jobs") == "completed", log.read_text()
    server.stop()
