"""`citus` and `citus_faults`: the runtime on a Citus cluster, against one PostgreSQL node.

`citus`: N no-op jobs queued at once, drained by W real worker processes, on a throwaway Citus
cluster (a coordinator node and two worker nodes, dispatcher/devtools/citus_cluster.py) and on one
node of the same PostgreSQL binaries (15, stock durability on both; not the embedded PostgreSQL 18
of the other scenarios: another major version would blur what Citus costs), in interleaved
rounds. Per target and mode: jobs/s, statements and round trips per job (pg_stat_statements on
every node), PostgreSQL CPU per 1000 jobs on each node, and each worker node's share of the jobs
and of the CPU against its share of the buckets. Statements per job: what the clients sent (to the
node, or to the coordinator node); on the cluster node_statements_per_job adds what the
coordinator node sent on to the worker nodes, and round trips count both, a remote BEGIN and the
distributed transaction id Citus sends with it as one.

`citus_faults`: a drain on the cluster during which one worker process is killed (SIGKILL, and a
replacement started) and one worker node restarts; then, from the database and from the handlers'
own record (bench/citus_app.py), whether any job was lost, completed twice or run twice at once.

Both start their servers themselves (--dsn is refused): nothing else may run on the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import statements
from bench.core import (
    Result,
    cpu_seconds_of,
    machine,
    postgres_cpu_seconds,
)
from bench.drain import drain_seconds, median_run
from bench.fleet import Fleet
from bench.plots import citus_plot
from bench.runs import enqueue_jobs
from coordinator.pg.sqlfile import load
from dispatcher.db import NUM_BUCKETS, distribute, migrate, query
from dispatcher.devtools.citus_cluster import CitusCluster, citus_missing, server_bindir
from dispatcher.devtools.embedded import EmbeddedPostgres
from dispatcher.devtools.harness import watch_until_done

SCENARIOS = ("citus", "citus_faults")
ONE_NODE, CLUSTER = "one_node", "citus"
DATABASE = "bench"
WORKER_NODES = 2
# The bench's own sessions log in as this role, so that every node can leave out what they cost:
# their statements (pg_stat_statements keys on the role) and their backends' CPU, on a worker node
# too, where the coordinator node serves them under the same role.
METER = "bench_meter"
APP = "bench.citus_app:registry"
# The faults drain's leases: a killed worker's claims come back after lease_s and its buckets move
# after coordinator_lease_s. At the defaults (30 s, 10 s) the end of every faults drain would be
# half a minute of waiting; the Citus tier's fault tests run at 2 s and 3 s.
FAULT_SETTINGS: dict[str, Any] = dict(lease_s=5.0, coordinator_lease_s=5, reaper_interval_s=1.0)
# Citus sends a remote transaction's BEGIN and its distributed transaction id in one message;
# pg_stat_statements counts them as two statements, one round trip.
_SAME_MESSAGE_AS_BEGIN = "SELECT assign_distributed_transaction_id"


def _sql(name: str) -> str:
    return load("bench", "citus.sql")[name]


def _as_meter(dsn: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, user=METER)


@dataclass(frozen=True)
class Node:
    name: str  # node, or coordinator, worker-1, worker-2
    server: EmbeddedPostgres

    @property
    def dsn(self) -> str:
        return self.server.dsn_for(DATABASE)


@dataclass(frozen=True)
class Target:
    name: str  # ONE_NODE or CLUSTER
    dsn: str  # what clients connect to: the node, or the coordinator node
    nodes: tuple[Node, ...]

    @property
    def distributed(self) -> bool:
        return len(self.nodes) > 1


@dataclass(frozen=True)
class Servers:
    cluster: CitusCluster
    one_node: Target
    citus: Target


@contextmanager
def servers() -> Iterator[Servers]:
    """One PostgreSQL node and a Citus cluster, up together (their rounds interleave), each with
    a migrated database (distributed by bucket on the cluster), pg_stat_statements and the bench's
    role. The node runs the cluster's binaries, so the two differ by Citus and the settings it
    needs (wal_level logical among them: dispatcher/devtools/citus_cluster.py); the node keeps
    PostgreSQL's defaults, as the other scenarios' server does."""
    with ExitStack() as stack:
        single = stack.enter_context(
            EmbeddedPostgres(
                durable=True,
                max_connections=300,
                settings={"shared_preload_libraries": "pg_stat_statements"},
                system_bindir=server_bindir(),
            )
        )
        cluster = stack.enter_context(
            CitusCluster(WORKER_NODES, durable=True, preload=("pg_stat_statements",))
        )
        with psycopg.connect(single.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        one_dsn, cluster_dsn = single.dsn_for(DATABASE), cluster.create_database(DATABASE)
        for dsn in (one_dsn, cluster_dsn):
            with psycopg.connect(dsn, autocommit=True) as conn:
                # On the cluster, Citus creates both on every node.
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(METER))
                )
            migrate(dsn)
        placed = distribute(cluster_dsn)
        print(f"  citus: {'; '.join(placed)}", flush=True)
        names = ["coordinator", *(f"worker-{i + 1}" for i in range(len(cluster.workers)))]
        yield Servers(
            cluster,
            Target(ONE_NODE, one_dsn, (Node("node", single),)),
            Target(
                CLUSTER,
                cluster_dsn,
                tuple(Node(n, s) for n, s in zip(names, cluster.nodes, strict=True)),
            ),
        )


def machine_record(servers: Servers) -> dict[str, Any]:
    """machine() of the cluster's coordinator node, plus each target's nodes and settings."""
    record = machine(servers.citus.dsn)
    with psycopg.connect(servers.citus.dsn) as conn:
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'").fetchone()
    record["citus_version"] = row[0] if row else None
    record["targets"] = {}
    for target in (servers.one_node, servers.citus):
        with psycopg.connect(target.dsn) as conn:
            settings: dict[str, str] = dict(conn.execute(_sql("citus_settings")).fetchall())
        record["targets"][target.name] = {
            "nodes": [n.name for n in target.nodes],
            "settings": settings,
        }
    record["note"] = (
        "every node, the workers and the benchmark driver share these cores: a cluster on one "
        "machine shows what Citus costs per job, not what more machines would add"
    )
    return record


# -- one measured drain ------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One node's cumulative figures, the bench's own left out."""

    cpu_s: float
    usage: dict[str, statements.Usage]
    trips: int  # statements, less those sent in one message with the one before


class NodeMeter:
    """A session on each node of a target (as METER) that reads its PostgreSQL CPU and its
    pg_stat_statements."""

    def __init__(self, target: Target) -> None:
        self._nodes = target.nodes
        self._conns: list[psycopg.Connection[Any]] = []
        try:
            for node in target.nodes:
                self._conns.append(psycopg.connect(_as_meter(node.dsn), autocommit=True))
        except BaseException:
            self.close()
            raise

    def read(self) -> list[Reading]:
        readings = []
        for node, conn in zip(self._nodes, self._conns, strict=True):
            own = [r[0] for r in conn.execute(_sql("citus_meter_backends"), {"meter": METER})]
            cpu_s = postgres_cpu_seconds(node.server.pid) - cpu_seconds_of(own)
            totals: dict[str, list[float]] = {}
            same_message = 0
            for text, *figures in conn.execute(_sql("citus_statements"), {"meter": METER}):
                entry = totals.setdefault(statements.name_of(text), [0, 0.0, 0, 0])
                for i, value in enumerate(figures):
                    entry[i] += value
                if text.startswith(_SAME_MESSAGE_AS_BEGIN):
                    same_message += int(figures[0])
            usage = {
                name: statements.Usage(int(c), float(ms), int(r), int(b))
                for name, (c, ms, r, b) in totals.items()
            }
            calls = sum(u.calls for u in usage.values())
            readings.append(Reading(cpu_s, usage, calls - same_message))
        return readings

    def close(self) -> None:
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> NodeMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bucket_nodes(conn: psycopg.Connection[Any], target: Target) -> dict[int, str]:
    """bucket -> the name of the node holding it."""
    if not target.distributed:
        return dict.fromkeys(range(NUM_BUCKETS), target.nodes[0].name)
    by_port = {n.server.port: n.name for n in target.nodes}
    rows = conn.execute(_sql("citus_bucket_nodes"), {"buckets": NUM_BUCKETS}).fetchall()
    return {int(bucket): by_port[int(port)] for bucket, port in rows}


def citus_run(
    target: Target, mode: str, workers: int, jobs: int, *, timeout_s: float = 900
) -> dict[str, Any]:
    """One drain: a ready fleet, N no-op jobs committed at once, until all are done; every figure
    over the drain alone (from the commit to the last completion)."""
    label = f"citus {target.name} {mode} x{workers}"
    with psycopg.connect(_as_meter(target.dsn), autocommit=True) as conn:
        if target.distributed:
            # The bench's counts go over the shards on one connection per node, kept open: their
            # backends are left out of a node's CPU by pid, whereas a pool opened and closed per
            # count would leave their CPU in the postmaster's (what exited children used).
            conn.execute("SET citus.max_adaptive_executor_pool_size = 1")
        conn.execute("TRUNCATE dispatcher_jobs")
        with Fleet(target.dsn, mode, workers) as fleet, NodeMeter(target) as meter:
            fleet.wait_ready()
            with conn.transaction():  # the jobs appear at once, when it commits
                enqueue_jobs(conn, jobs)
                conn.execute(query("jobs_analyze"))
                before, client_before = meter.read(), fleet.cpu_seconds()
            watch_until_done(conn, fleet, jobs, label, timeout_s=timeout_s, every_s=0.1)
            after, client_after = meter.read(), fleet.cpu_seconds()
        seconds = drain_seconds(conn)
        holder = bucket_nodes(conn, target)
        done = {int(b): int(n) for b, n in conn.execute(_sql("citus_completed_per_bucket"))}
    cpu = [a.cpu_s - b.cpu_s for a, b in zip(after, before, strict=True)]
    calls = [
        sum(u.calls for u in statements.minus(a.usage, b.usage).values())
        for a, b in zip(after, before, strict=True)
    ]
    trips = [a.trips - b.trips for a, b in zip(after, before, strict=True)]
    # Worker nodes: what the coordinator node sent there for the clients (none on one node).
    forwarded = trips[1:]
    worker_cpu = sum(cpu[1:]) if target.distributed else cpu[0]
    nodes = []
    for i, node in enumerate(target.nodes):
        buckets = [b for b, name in holder.items() if name == node.name]
        nodes.append(
            {
                "node": node.name,
                "port": node.server.port,
                "buckets": len(buckets),
                "bucket_share": round(len(buckets) / NUM_BUCKETS, 3),
                "jobs_share": round(sum(done.get(b, 0) for b in buckets) / jobs, 3),
                "cpu_s_per_1k_jobs": round(cpu[i] / jobs * 1000, 3),
                "cpu_share": round(cpu[i] / sum(cpu), 3) if sum(cpu) > 0 else None,
                # Of the nodes that hold buckets: what to hold against bucket_share.
                "cpu_share_of_shard_nodes": round(cpu[i] / worker_cpu, 3)
                if buckets and worker_cpu > 0
                else None,
                "statements_per_job": round(calls[i] / jobs, 3),
            }
        )
    coordinator_usage = statements.minus(after[0].usage, before[0].usage)
    return {
        "target": target.name,
        "mode": mode,
        "workers": workers,
        "jobs": jobs,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds),
        # What the clients sent (to the node, or to the coordinator node).
        "statements_per_job": round(calls[0] / jobs, 3),
        "node_statements_per_job": round(sum(calls[1:]) / jobs, 3) if forwarded else None,
        # Client -> node, and coordinator node -> worker node: every message that waits for its
        # answer.
        "round_trips_per_job": round((trips[0] + sum(forwarded)) / jobs, 3),
        "pg_cpu_s_per_1k_jobs": round(sum(cpu) / jobs * 1000, 3),
        "client_cpu_us_per_job": round((client_after - client_before) / jobs * 1e6, 1),
        "nodes": nodes,
        "statements": statements.per_job(coordinator_usage, jobs),
    }


def citus_suite(
    servers: Servers,
    result: Result,
    *,
    jobs: int,
    workers: list[int],
    modes: list[str],
    repeat: int = 1,
) -> None:
    """Per worker count, `repeat` rounds of one run per target and mode, interleaved so that slow
    drift hits every configuration alike; each configuration's median run as its row, and the
    cluster's ratios to the node's."""
    for w in workers:
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(repeat):
            for target in (servers.one_node, servers.citus):
                for mode in modes:
                    runs.setdefault((target.name, mode), []).append(
                        citus_run(target, mode, w, jobs)
                    )
        for target_runs in runs.values():
            row = median_run(target_runs)
            # Printed as tables of their own, not on the row's line.
            tables = {k: row.pop(k) for k in ("nodes", "statements")}
            result.add(**row)
            result.rows[-1].update(tables)
    add_ratios(result.rows)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each cluster row's jobs/s and PostgreSQL CPU over the node's (same mode and worker count),
    from medians of the same rounds."""
    by_key = {(r["target"], r["mode"], r["workers"]): r for r in rows}
    for row in rows:
        base = by_key.get((ONE_NODE, row["mode"], row["workers"]))
        if row["target"] != CLUSTER or base is None:
            continue
        row["vs_one_node"] = round(row["jobs_per_s"] / base["jobs_per_s"], 2)
        if base["pg_cpu_s_per_1k_jobs"]:
            row["pg_cpu_vs_one_node"] = round(
                row["pg_cpu_s_per_1k_jobs"] / base["pg_cpu_s_per_1k_jobs"], 2
            )


# -- the scenarios -----------------------------------------------------------------------------

CITUS_COLUMNS = [
    "target",
    "mode",
    "workers",
    "jobs",
    "seconds",
    "jobs_per_s",
    "vs_one_node",
    "statements_per_job",
    "node_statements_per_job",
    "round_trips_per_job",
    "pg_cpu_s_per_1k_jobs",
    "pg_cpu_vs_one_node",
    "client_cpu_us_per_job",
    "runs_jobs_per_s",
]
NODE_COLUMNS = [
    "target",
    "mode",
    "workers",
    "node",
    "buckets",
    "bucket_share",
    "jobs_share",
    "cpu_s_per_1k_jobs",
    "cpu_share",
    "cpu_share_of_shard_nodes",
    "statements_per_job",
]
FAULT_COLUMNS = [
    "mode",
    "workers",
    "jobs",
    "seconds",
    "jobs_per_s",
    "killed_at_done",
    "restarted_at_done",
    "faults_mid_drain",
    "node_down_s",
    "claimed_again",
    "ran_again",
    "cut_by_kill",
    "not_completed",
    "never_ran",
    "completed_twice",
    "overlapping",
    "cut_by_live",
    "live_worker_exits",
    "outcome",
]


def run_scenarios(
    scenarios: list[str],
    *,
    jobs: int | None,
    workers: list[int],
    modes: list[str],
    repeat: int,
    quick: bool,
    out_dir: Path,
    show_statements: bool = False,
) -> int:
    """Run `citus` and/or `citus_faults` on one set of servers; print, write JSON and the plot.
    Returns 1 when a faults run failed its checks, else 0."""
    missing = citus_missing()
    if missing is not None:
        raise SystemExit(f"bench citus: {missing} (install Citus 13.2 for PostgreSQL 15)")
    failed = False
    with servers() as running:
        record = machine_record(running)
        label = (
            f"{record['cores']} cores, PostgreSQL {record['postgres']}, "
            f"Citus {record['citus_version']}, Python {record['python']}"
        )
        for scenario in scenarios:
            result = Result(scenario, machine=record)
            print(
                f"\n== {scenario}: {label} (every node, the workers and the driver share the "
                "cores)",
                flush=True,
            )
            if scenario == "citus":
                citus_suite(
                    running,
                    result,
                    jobs=jobs or (2_000 if quick else 20_000),
                    workers=workers,
                    modes=modes,
                    repeat=1 if quick else repeat,
                )
                print()
                print(result.table([c for c in CITUS_COLUMNS if any(c in r for r in result.rows)]))
                per_node = Result(
                    "nodes",
                    rows=[
                        {k: r[k] for k in ("target", "mode", "workers")} | node
                        for r in result.rows
                        for node in r["nodes"]
                    ],
                )
                print("\nper node (shares of the jobs and of PostgreSQL's CPU vs of the buckets)")
                print(per_node.table(NODE_COLUMNS))
                if show_statements:
                    for row in result.rows:
                        print(
                            f"\n{row['target']} {row['mode']} x{row['workers']}: statements the "
                            "clients sent, per job"
                        )
                        print(statements.table(row["statements"]))
                citus_plot(result.rows, out_dir, label)
            else:
                # Imported here: the faults drain runs on this module's servers.
                from bench.citus_faults import faults_suite

                faults_suite(
                    running,
                    result,
                    jobs=jobs or (3_000 if quick else 100_000),
                    workers=workers[0],
                    modes=modes,
                )
                print()
                print(result.table(FAULT_COLUMNS))
                failed = failed or any(r["outcome"] != "ok" for r in result.rows)
            print(f"written: {result.save(out_dir)}", flush=True)
    return 1 if failed else 0
