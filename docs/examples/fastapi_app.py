# fastapi_app.py
"""Serve with `uvicorn fastapi_app:app`; RUN_WORKER=1 also runs a worker in the app's process. Or
run the workers on their own: DISPATCHER_DSN=$DATABASE_URL dispatcher run --app
fastapi_app:registry"""

import asyncio
import contextlib
import logging
import os

from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from dispatcher import Config, Job, Registry, Worker, enqueue

DATABASE_URL = os.environ["DATABASE_URL"]
log = logging.getLogger(__name__)
registry = Registry()


@registry.handler("send_welcome")
async def send_welcome(job: Job) -> None:
    log.info("welcome, %s", job.payload["email"])  # send the mail here


@contextlib.asynccontextmanager
async def worker_in_process():
    worker = Worker(Config.load(dsn=DATABASE_URL), registry)  # DISPATCHER_* settings apply
    running, stopping = asyncio.create_task(worker.run()), False
    # Nothing restarts a worker that ends on its own (a lost schema, stuck handlers): say so.
    running.add_done_callback(
        lambda task: stopping or log.error("the in-process worker ended: %r", task)
    )
    try:
        yield
    finally:
        stopping = True
        worker.stop()  # graceful: running jobs finish (within DISPATCHER_SHUTDOWN_GRACE_S)
        await running


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    async with AsyncConnectionPool(DATABASE_URL, open=False) as pool:
        app.state.pool = pool
        run_worker = os.environ.get("RUN_WORKER") == "1"
        async with worker_in_process() if run_worker else contextlib.nullcontext():
            yield


app = FastAPI(lifespan=lifespan)


class SignUp(BaseModel):
    email: str


@app.post("/signup", status_code=201)
async def signup(body: SignUp) -> dict[str, int]:
    # one transaction, committed at the end of the block
    async with app.state.pool.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO users (email) VALUES (%s) RETURNING id", (body.email,)
        )
        (user_id,) = await cur.fetchone()
        await enqueue(conn, "send_welcome", {"user_id": user_id, "email": body.email})
    return {"id": user_id}  # after the commit: a 201 means the user and the job are both there
