"""python -m bench SCENARIO [options], from a checkout (`make bench`): run a benchmark, print a
table, write bench/out/SCENARIO.json and PNG plots.

Runs against a throwaway embedded PostgreSQL (stock durability: fsync and synchronous_commit on)
unless --dsn or DISPATCHER_DSN names a server; `citus` and `citus_faults` start a Citus cluster and
one node of their own instead (bench/citus.py). Workers are real `dispatcher run` processes;
with --external-workers, the live workers of a deployed fleet instead (bench/external.py).
Never gated in CI on a wall-clock figure: `--quick` only proves the suite runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import citus, pyspy, statements
from bench.churn import COLUMNS as CHURN_COLUMNS
from bench.churn import PASS_COLUMNS, churn_suite
from bench.coldstart import coldstart_suite, rolling_suite
from bench.core import OUT_DIR, Result, database, machine
from bench.drain import drain_suite
from bench.enqueue import enqueue_suite
from bench.external import add_arguments as add_external_arguments
from bench.external import main as external_main
from bench.keyed import MIXES, keyed_suite
from bench.limits import limits_suite
from bench.plots import (
    churn_plot,
    coldstart_plot,
    curve_plot,
    keyed_plot,
    limits_plot,
    scaling_plots,
    schedules_plot,
    workflows_plot,
)
from bench.scenarios import burst_suite, jitter_suite, latency_suite, scaling_suite, skew_suite
from bench.schedules import schedules_suite
from bench.workflows import COLUMNS as WORKFLOW_COLUMNS
from bench.workflows import workflows_suite
from dispatcher.devtools.citus_cluster import citus_missing

SCENARIOS = [
    "drain",
    "burst",
    "scaling",
    "skew",
    "jitter",
    "latency",
    "enqueue",
    "coldstart",
    "rolling",
    "keyed",
    "limits",
    "schedules",
    "workflows",
    "churn",
    # On servers of its own (bench/citus.py); `all` skips it where Citus is not installed.
    "citus",
]
# Run when named only: `all` leaves them out. citus_faults drains under faults to check, not to
# measure, what the Citus tier's fault tests (tests/citus) already check in CI.
NAMED_ONLY = ["citus_faults"]
MODES = ["partitioned", "skip_locked"]
RUN_COLUMNS = [
    "mode",
    "workers",
    "jobs",
    "seconds",
    "jobs_per_s",
    "claim_p50_ms",
    "claim_p99_ms",
    "poll_p50_ms",
    "poll_p99_ms",
    "idx_reads_per_job",
    "heap_fetch_per_job",
    "max_lock_waiters",
    "dead_tuples_end",
    "pg_cpu_us_per_job",
    "client_cpu_us_per_job",
    "client_start_cpu_s",
    "idle_pg_cpu_ms_per_s",
    "idle_client_cpu_ms_per_s",
    "autovacuums",
]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def run(scenario: str, args: argparse.Namespace, dsn: str, out_dir: Path) -> Result:
    quick = args.quick
    jobs = args.jobs or (3_000 if quick else 200_000)
    modes = [m for m in args.modes.split(",") if m]
    result = Result(scenario, machine=machine(dsn))
    label = (
        f"{result.machine['cores']} cores, PostgreSQL {result.machine['postgres']}, "
        f"Python {result.machine['python']}"
    )
    print(f"\n== {scenario}: {label} (PostgreSQL and workers share the cores)", flush=True)
    columns = RUN_COLUMNS
    if scenario == "drain":
        workers = _ints(args.workers or ("2" if quick else "1,4"))
        drain_suite(
            dsn,
            result,
            jobs=jobs,
            workers=workers,
            modes=modes,
            repeat=1 if quick else args.repeat,
            completed_jobs=tuple(c for c in args.completed_jobs.split(",") if c),
        )
        columns = [
            "kind",
            *RUN_COLUMNS[:5],
            "ratio_to_ceiling",
            "ratio_to_minimal",
            "ratio_to_minimal_delete",
            *RUN_COLUMNS[5:],
            "runs_jobs_per_s",
        ]
    elif scenario == "burst":
        burst_suite(
            dsn,
            result,
            jobs=jobs,
            workers=_ints(args.workers or ("2" if quick else "8"))[0],
            modes=modes,
            repeat=1 if quick else args.repeat,
        )
        columns = [
            *RUN_COLUMNS[:5],
            "due_to_done_s",
            "start_late_p99_ms",
            "vs_skip_locked",
            "rounds_vs_skip_locked",
            "median_round_vs_skip_locked",
            "median_interval",
            *RUN_COLUMNS[5:],
            "runs_jobs_per_s",
        ]
        curve_plot(
            result.rows,
            out_dir,
            label,
            "burst_drain_curve.png",
            f"Burst: {jobs} jobs due at one instant",
        )
    elif scenario == "scaling":
        scaling_suite(
            dsn,
            result,
            jobs=jobs,
            workers=_ints(args.workers or ("1,2" if quick else "1,2,4,8,16")),
            modes=modes,
            repeat=1 if quick else args.repeat,
        )
        scaling_plots(result.rows, out_dir, label)
        columns = [
            *RUN_COLUMNS[:5],
            "median_round_vs_skip_locked",
            "rounds_vs_skip_locked",
            "median_interval",
            "stolen_share",
            *RUN_COLUMNS[5:],
            "runs_jobs_per_s",
        ]
    elif scenario == "skew":
        skew_suite(
            dsn,
            result,
            jobs=jobs,
            workers=_ints(args.workers or ("2" if quick else "4"))[0],
            modes=modes,
        )
        columns = ["hot_share", *RUN_COLUMNS[:5], "vs_even", "stolen_share", *RUN_COLUMNS[5:]]
    elif scenario == "jitter":
        jitter_suite(
            dsn,
            result,
            jobs=jobs,
            workers=_ints(args.workers or ("2" if quick else "8"))[0],
            modes=modes,
        )
        columns = [
            "jitter_s",
            *RUN_COLUMNS[:3],
            "due_to_done_s",
            "start_late_p50_ms",
            "start_late_p99_ms",
            "poll_p99_ms",
            "max_lock_waiters",
        ]
        curve_plot(
            result.rows,
            out_dir,
            label,
            "jitter_drain_curve.png",
            "Burst with enqueue jitter 0 s vs 5 s",
            label_of=lambda r: f"{r['mode']}, jitter {r['jitter_s']:g} s",
        )
    elif scenario == "latency":
        latency_suite(
            dsn,
            result,
            jobs=args.jobs or (20 if quick else 200),
            workers=_ints(args.workers or "2")[0],
            modes=modes,
        )
        columns = [
            "mode",
            "workers",
            "jobs",
            "add_to_start_p50_ms",
            "add_to_start_p99_ms",
            "add_to_start_max_ms",
            "run_at_to_start_p50_ms",
            "run_at_to_start_p99_ms",
            "run_at_to_start_max_ms",
        ]
    elif scenario == "coldstart":
        coldstart_suite(
            dsn,
            result,
            jobs=jobs,
            workers=_ints(args.workers or ("2" if quick else "2,4,8")),
            modes=modes,
            profiles=tuple(args.profiles.split(",")),
            repeat=1 if quick else args.repeat,
        )
        columns = [
            "profile",
            "mode",
            "workers",
            "jobs",
            "spawn_to_first_claim_s",
            "spawn_to_done_s",
            "drain_s",
            "jobs_per_s",
            "vs_skip_locked",
            "rounds_vs_skip_locked",
            "median_round_vs_skip_locked",
            "median_interval",
            "ran_twice",
            "max_lock_waiters",
            "autovacuums",
            "pg_cpu_us_per_job",
            "client_cpu_us_per_job",
            "runs_jobs_per_s",
        ]
        coldstart_plot(result.rows, out_dir, label)
    elif scenario == "rolling":
        rolling_suite(
            dsn,
            result,
            jobs=jobs,
            workers=_ints(args.workers or ("2" if quick else "4"))[0],
            modes=modes,
            profiles=tuple(args.profiles.split(",")),
        )
        columns = [
            "profile",
            "mode",
            "workers",
            "jobs",
            "seconds",
            "jobs_per_s",
            "vs_skip_locked",
            "rollout_s",
            "rollout_share_of_drain",
            "steady_jobs_per_s",
            "dip_jobs_per_s",
            "dip_vs_steady",
            "ran_twice",
            "not_completed",
            "stop_max_s",
        ]
        curve_plot(
            result.rows,
            out_dir,
            label,
            "rolling_drain_curve.png",
            f"{jobs} jobs drained while every worker is replaced",
            label_of=lambda r: f"{r['mode']}, {r['profile']}",
            xlabel="seconds after the first claim",
        )
    elif scenario == "keyed":
        keyed_suite(
            dsn,
            result,
            jobs=jobs,
            workers=_ints(args.workers or ("2" if quick else "4,8")),
            modes=modes,
            mixes=[m for m in args.mixes.split(",") if m],
            profiles=("bench",) if quick else tuple(args.profiles.split(",")),
        )
        columns = [
            "profile",
            "mix",
            "mode",
            "workers",
            "jobs",
            "due_to_done_s",
            "due_jobs_per_s",
            "vs_none",
            "vs_skip_locked",
            "order_ok",
            "order_violations",
            "ran_twice",
            "not_run",
            "keys",
            "top_key_jobs",
            "pg_cpu_us_per_job",
            "client_cpu_us_per_job",
            "idx_reads_per_job",
            "ordering_idx_reads_per_job",
            "start_late_p99_ms",
            "max_lock_waiters",
            "autovacuums",
            "due_after_commit_s",
        ]
        keyed_plot(result.rows, out_dir, label)
    elif scenario == "limits":
        limits_suite(
            dsn,
            result,
            workers=_ints(args.workers or "4")[0],
            modes=modes,
            per_second=args.per_second,
            max_running=args.max_running,
            windows=2 if quick else args.windows,
            window_s=5.0 if quick else 10.0,
            free_jobs=args.jobs or (2_000 if quick else 20_000),
        )
        columns = [
            "mode",
            "workers",
            "seconds",
            "windows_with_backlog",
            "min_window_ratio",
            "max_window_starts",
            "max_starts_any_window",
            "window_bound",
            "rate_within_bound",
            "rate_held",
            "capped_max_running",
            "max_running",
            "cap_held",
            "capped_mean_running",
            "capped_jobs_per_s",
            "free_done_s",
            "capped_done_s",
            "rated_done_s",
            "ran_twice",
            "not_run",
        ]
        limits_plot(result.rows, out_dir, label)
    elif scenario == "schedules":
        schedules_suite(
            dsn,
            result,
            workers=_ints(args.workers or "2")[0],
            modes=modes,
            profiles=("defaults",) if quick else tuple(args.profiles.split(",")),
            seconds=10.0 if quick else args.seconds,
        )
        columns = [
            "profile",
            "mode",
            "workers",
            "seconds",
            "schedules",
            "slots",
            "jobs",
            "missed",
            "ran_twice",
            "not_run",
            "late_p50_ms",
            "late_p99_ms",
            "late_max_ms",
            "within_1s",
            "lead_min_s",
            "lead_median_s",
        ]
        schedules_plot(result.rows, out_dir, label)
    elif scenario == "workflows":
        workflows_suite(
            dsn,
            result,
            workers=_ints(args.workers or "2")[0],
            modes=modes,
            profiles=("defaults",) if quick else tuple(args.profiles.split(",")),
            children=1_000 if quick else 10_000,
            steps=100 if quick else 1_000,
        )
        columns = WORKFLOW_COLUMNS
        workflows_plot(result.rows, out_dir, label)
    elif scenario == "churn":
        churn_suite(
            dsn,
            result,
            workers=_ints(args.workers or ("2" if quick else "4"))[0],
            modes=modes,
            completed_jobs=tuple(c for c in args.completed_jobs.split(",") if c),
            rate=500 if quick else args.churn_rate,
            seconds=8 if quick else args.churn_seconds,
            sample_s=2 if quick else args.churn_sample_s,
            retention_s=2 if quick else args.retention_s,
        )
        columns = CHURN_COLUMNS + PASS_COLUMNS[2:]
        churn_plot(result.rows, out_dir, label)
    else:
        enqueue_suite(
            dsn,
            result,
            single=500 if quick else 5_000,
            bulk=jobs,
            repeat=1 if quick else args.repeat,
        )
        columns = ["path", "jobs", "jobs_per_s", "ratio_to_ceiling", "runs_jobs_per_s"]
    print()
    print(result.table([c for c in columns if any(c in r for r in result.rows)]))
    for row in result.rows:
        what = (
            f"{row.get('kind', 'runtime')} {row['mode']} x{row['workers']}" if "mode" in row else ""
        )
        if row.get("statements"):
            print(f"\n{what}: PostgreSQL time per job by statement")
            print(statements.table(row["statements"]))
        if row.get("py_spy"):
            print(f"\n{what}: one worker's CPU per job by function (py-spy)")
            print(pyspy.table(row["py_spy"]))
    print(f"written: {result.save(out_dir)}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("scenarios", nargs="+", choices=[*SCENARIOS, *NAMED_ONLY, "all"])
    parser.add_argument(
        "--dsn",
        default=None,
        help="the server to run on (default: DISPATCHER_DSN, else a throwaway embedded "
        "PostgreSQL); refused with citus and citus_faults, which start a Citus cluster and one "
        "node of their own and ignore DISPATCHER_DSN",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="jobs per run (default 200,000; --quick 3,000; limits: "
        "the `free` jobs, 20,000; --quick 2,000; citus: 20,000, --quick 2,000; citus_faults: "
        "100,000, --quick 3,000)",
    )
    parser.add_argument(
        "--workers",
        default=None,
        help="comma-separated worker process counts (citus: default 2; citus_faults: the first, "
        "default 2)",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--profiles",
        default="defaults,bench",
        help="coldstart/rolling/keyed/workflows: settings profiles, defaults (what a user gets) "
        "and/or bench (concurrency 500, poll 0.1 s)",
    )
    parser.add_argument(
        "--completed-jobs",
        default="keep,delete",
        help="drain: the runtime and the ceiling once per value of DISPATCHER_COMPLETED_JOBS "
        "given; churn: a stream per value",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="drain/burst/scaling/skew/jitter: PostgreSQL's time per statement per job "
        "(pg_stat_statements; the throwaway server preloads it); citus: print the per-statement "
        "tables it always records",
    )
    parser.add_argument(
        "--py-spy",
        action="store_true",
        help="drain/burst/scaling/skew/jitter: sample one worker with py-spy during each run and "
        "list its CPU per job by function (pip install py-spy; it takes CPU of its own: "
        "read rates from runs without it)",
    )
    parser.add_argument(
        "--mixes",
        default=",".join(MIXES),
        help="keyed: ordering-key mixes (none is the baseline the others' vs_none divides by)",
    )
    parser.add_argument(
        "--per-second",
        type=float,
        default=50.0,
        help="limits: the rate limit R of the `rated` type (starts per second, fleet-wide)",
    )
    parser.add_argument(
        "--max-running",
        type=int,
        default=5,
        help="limits: the max-running limit N of the `capped` type (20-50 ms handlers)",
    )
    parser.add_argument(
        "--windows",
        type=int,
        default=6,
        help="limits: 10 s windows of backlog for the `rated` type (--quick: 2 of 5 s)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="schedules: seconds the fleet runs its every-second schedules (--quick: 10)",
    )
    parser.add_argument(
        "--churn-rate",
        type=float,
        default=3000.0,
        help="churn: jobs enqueued per second, a batch every 0.1 s (--quick: 500)",
    )
    parser.add_argument(
        "--churn-seconds",
        type=float,
        default=600.0,
        help="churn: how long each stream runs (--quick: 8)",
    )
    parser.add_argument(
        "--churn-sample-s",
        type=float,
        default=60.0,
        help="churn: seconds between two readings of the table and the claims (--quick: 2)",
    )
    parser.add_argument(
        "--retention-s",
        type=float,
        default=60.0,
        help="churn: DISPATCHER_COMPLETED_RETENTION_S of the fleet (--quick: 2)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="drain/burst/scaling/enqueue/coldstart/citus: runs per configuration (median)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves the suite runs")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    add_external_arguments(parser)
    args = parser.parse_args(argv)
    scenarios = SCENARIOS if "all" in args.scenarios else args.scenarios
    named = [s for s in args.scenarios if s in citus.SCENARIOS]
    if named and args.dsn:
        parser.error(
            f"{' and '.join(named)}: on a Citus cluster and one node the bench starts itself; "
            "leave out --dsn"
        )
    args.dsn = args.dsn or os.environ.get("DISPATCHER_DSN")
    if args.external_workers:
        return external_main(args, scenarios)
    on_citus = [s for s in scenarios if s in citus.SCENARIOS]
    if on_citus and not named and (missing := citus_missing()) is not None:
        # As the Citus test tier does: skipped, unless CI requires it (.ci/run installs Citus).
        if os.environ.get("DISPATCHER_TEST_CITUS") == "required":
            raise SystemExit(f"bench all: {missing}, and DISPATCHER_TEST_CITUS=required")
        print(f"bench all: {' and '.join(on_citus)} skipped: {missing}", flush=True)
        on_citus = []
    args.out.mkdir(parents=True, exist_ok=True)
    if others := [s for s in scenarios if s not in citus.SCENARIOS]:
        with database(args.dsn, statements=args.statements) as dsn:
            if args.statements:
                statements.enable(dsn)
            if args.py_spy:
                pyspy.enable(args.out)
            for scenario in others:
                run(scenario, args, dsn, args.out)
    if on_citus:
        return citus.run_scenarios(
            on_citus,
            jobs=args.jobs,
            workers=_ints(args.workers or "2"),
            modes=[m for m in args.modes.split(",") if m],
            repeat=args.repeat,
            quick=args.quick,
            out_dir=args.out,
            show_statements=args.statements,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
