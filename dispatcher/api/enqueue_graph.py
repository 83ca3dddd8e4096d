"""Insert a graph of jobs (dispatcher/db/dependencies.py) into whatever enqueue was given: a
connection (joining its transaction), a pool (a connection and a transaction of its own), or the
in-memory store of dispatcher.testing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import psycopg_pool

from dispatcher.db.dependencies import GraphJob, insert_graph_async, insert_graph_sync
from dispatcher.db.port import InProcessStore
from dispatcher.db.translate import translate_errors


async def graph_async(
    target: psycopg.AsyncConnection[Any] | psycopg_pool.AsyncConnectionPool | InProcessStore,
    graph: Sequence[GraphJob],
) -> list[int]:
    """Each job's id, in graph order: all inserted, or none."""
    if isinstance(target, InProcessStore):
        return target.insert_graph(graph)
    if isinstance(target, psycopg_pool.AsyncConnectionPool):
        async with target.connection() as conn:
            return await graph_async(conn, graph)
    with translate_errors("enqueue"):
        return await insert_graph_async(target, graph)


def graph_sync(
    target: psycopg.Connection[Any] | psycopg_pool.ConnectionPool | InProcessStore,
    graph: Sequence[GraphJob],
) -> list[int]:
    if isinstance(target, InProcessStore):
        return target.insert_graph(graph)
    if isinstance(target, psycopg_pool.ConnectionPool):
        with target.connection() as conn:
            return graph_sync(conn, graph)
    with translate_errors("enqueue"):
        return insert_graph_sync(target, graph)
