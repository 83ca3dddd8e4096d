# typed_app.py
"""typed_app.py: jobs declared as typed tasks, enqueued with their functions' own arguments.

`mypy --strict` checks every enqueue below against its task's signature, as it checks a call
(tests/examples/test_typed_example.py runs it here, and on a wrong argument, which it refuses).
Workers: `dispatcher run --app typed_app:registry --queues default,emails`.
"""

from __future__ import annotations

from typing import Any

import psycopg

from dispatcher import Registry, current_job, enqueue_many_sync

registry = Registry()
outbox: list[tuple[str, str, list[str], int]] = []  # stands in for a mail service
thumbnails: dict[int, int] = {}  # image id -> width: stands in for an image store


@registry.task(queue="emails", max_attempts=5)
async def send_email(to: str, subject: str, cc: list[str] | None = None) -> None:
    """Its jobs call it with the arguments given to `send_email.enqueue(...)`; the job itself
    (attempts, scheduled_for...) is `current_job()`."""
    outbox.append((to, subject, cc or [], current_job().attempts))


@registry.task(timeout_s=60)
def make_thumbnail(image_id: int, width: int = 200) -> int:
    """A plain function runs in the worker's thread pool, as a plain handler does."""
    thumbnails[image_id] = width
    return width


def sign_up(conn: psycopg.Connection[Any], email: str) -> int | None:
    """In the caller's transaction: the welcome email exists if and only if the sign-up commits.
    One per address (the dedupe key), a minute later (delay_s)."""
    welcome = send_email.with_options(dedupe_key=f"welcome:{email}", delay_s=60)
    return welcome.enqueue_sync(conn, email, "Welcome", cc=["team@example.com"])


def upload_album(conn: psycopg.Connection[Any], image_ids: list[int]) -> int:
    """Many jobs of one task in one COPY: `spec` checks each one's arguments as enqueue does."""
    urgent = make_thumbnail.with_options(priority=-1)
    return enqueue_many_sync(conn, [urgent.spec(image_id, width=128) for image_id in image_ids])


async def notify(conn: psycopg.AsyncConnection[Any], to: str) -> int | None:
    """The async form, for async code: `await task.enqueue(conn, ...)`."""
    return await send_email.enqueue(conn, to, "Your album is ready")
