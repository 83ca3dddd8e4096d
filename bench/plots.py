"""PNG plots from the JSON the scenarios write (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODES = {
    "partitioned": ("tab:blue", "o"),
    "skip_locked": ("tab:red", "s"),
    "partitioned_no_steal": ("tab:cyan", "^"),
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(
    plt: Any, fig: Any, ax: Any, path: Path, machine: str, legend_size: str | None = None
) -> Path:
    """Grid, legend, the machine in small print, then write the PNG and free the figure."""
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.text(0.01, 0.01, machine, fontsize=7, alpha=0.7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scaling_plots(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> list[Path]:
    plt = _pyplot()
    paths = []
    for column, title, filename in (
        ("jobs_per_s", "Throughput vs worker processes", "scaling_throughput.png"),
        ("poll_p99_ms", "Poll-cycle p99 (ms) vs worker processes", "scaling_poll_p99.png"),
        ("idx_reads_per_job", "Claim-index tuples read per claimed job", "scaling_tuples_read.png"),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for mode, (color, marker) in MODES.items():
            points = sorted(
                (r["workers"], r[column])
                for r in rows
                if r["mode"] == mode and r.get(column) is not None
            )
            if points:
                ax.plot(*zip(*points, strict=True), marker=marker, color=color, label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("worker processes")
        ax.set_title(title)
        paths.append(_finish(plt, fig, ax, out_dir / filename, machine))
    return paths


def curve_plot(
    rows: list[dict[str, Any]],
    out_dir: Path,
    machine: str,
    filename: str,
    title: str,
    label_of: Any = lambda r: r["mode"],
    xlabel: str = "seconds after the jobs became due",
) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for row in rows:
        if row.get("curve"):
            color, _ = MODES.get(row["mode"], ("black", "."))
            xs, ys = zip(*row["curve"], strict=True)
            ax.plot(
                (0, *xs),
                (0, *ys),
                color=color,
                label=label_of(row),
                linestyle="--" if row.get("jitter_s") or row.get("profile") == "defaults" else "-",
            )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("jobs done")
    ax.set_title(title)
    return _finish(plt, fig, ax, out_dir / filename, machine)


def coldstart_plot(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> Path:
    """Spawn -> all done against worker processes, per mode and settings profile."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for profile, style in (("defaults", "--"), ("bench", "-")):
        for mode, (color, marker) in MODES.items():
            points = sorted(
                (r["workers"], r["spawn_to_done_s"])
                for r in rows
                if r["mode"] == mode and r.get("profile") == profile
            )
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    marker=marker,
                    color=color,
                    linestyle=style,
                    label=f"{mode}, {profile}",
                )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("worker processes spawned against the backlog")
    ax.set_ylabel("seconds, spawn -> all done")
    ax.set_title("Cold start: workers spawned against a queued backlog")
    return _finish(plt, fig, ax, out_dir / "coldstart.png", machine)


def keyed_plot(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> Path:
    """Throughput from the due instant, per key mix: one bar per mode and worker count."""
    plt = _pyplot()
    mixes = list(dict.fromkeys(r["mix"] for r in rows))
    series = list(dict.fromkeys((r["mode"], r["workers"], r.get("profile")) for r in rows))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    width = 0.8 / max(1, len(series))
    counts = sorted({w for _, w, _ in series})
    for n, (mode, workers, profile) in enumerate(series):
        color, _ = MODES.get(mode, ("black", "."))
        shade = 0.45 + 0.55 * (counts.index(workers) + 1) / len(counts)  # more workers, darker
        at = {
            r["mix"]: r.get("due_jobs_per_s") or 0
            for r in rows
            if (r["mode"], r["workers"], r.get("profile")) == (mode, workers, profile)
        }
        ax.bar(
            [i + (n - (len(series) - 1) / 2) * width for i in range(len(mixes))],
            [at.get(mix, 0) for mix in mixes],
            width,
            color=color,
            alpha=shade,
            hatch="//" if profile == "defaults" else None,  # the defaults a user gets: hatched
            label=f"{mode} x{workers}" + (f" ({profile})" if profile else ""),
        )
    ax.set_xticks(range(len(mixes)), mixes)
    ax.set_xlabel("ordering keys of the jobs")
    ax.set_ylabel("jobs/s, due -> all done")
    ax.set_title("Burst with ordering keys")
    return _finish(plt, fig, ax, out_dir / "keyed_throughput.png", machine, legend_size="small")


def limits_plot(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> Path:
    """Above: starts of the rate-limited type per second, against its rate. Below: jobs of the
    capped type running per 0.1 s (the most at once, and the mean), against its max_running. Per
    mode; a dotted line where the unlimited type's last job ended."""
    plt = _pyplot()
    fig, (rate_ax, cap_ax) = plt.subplots(2, 1, figsize=(6.4, 6.4), sharex=True)
    for row in rows:
        color, _ = MODES.get(row["mode"], ("black", "."))
        per_s = row.get("rated_starts_per_s") or []
        rate_ax.step(
            range(len(per_s)),
            per_s,
            where="post",
            color=color,
            label=f"{row['mode']}: rated starts/s",
        )
        running = row.get("capped_running") or []
        cap_ax.step(
            [i * 0.1 for i in range(len(running))],
            running,
            where="post",
            color=color,
            linewidth=0.8,
            label=f"{row['mode']}: capped, most at once",
        )
        mean = row.get("capped_mean_running_series") or []
        cap_ax.step(
            [i * 0.1 for i in range(len(mean))],
            mean,
            where="post",
            color=color,
            linewidth=0.8,
            alpha=0.45,
            linestyle="-.",
            label=f"{row['mode']}: capped, mean",
        )
        if row.get("free_done_s") is not None:
            for ax in (rate_ax, cap_ax):
                ax.axvline(row["free_done_s"], color=color, linestyle=":", linewidth=1)
    if rows:
        rate_ax.axhline(
            rows[0]["per_second"],
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"R = {rows[0]['per_second']:g}/s (burst {rows[0]['burst_jobs']:g})",
        )
        cap_ax.axhline(
            rows[0]["max_running"],
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"N = {rows[0]['max_running']}",
        )
    rate_ax.set_ylabel("jobs started per second")
    rate_ax.set_title("Fleet-wide limits under a backlog (dotted: the unlimited type done)")
    rate_ax.grid(True, alpha=0.3)
    rate_ax.legend(fontsize="small")
    cap_ax.set_ylabel("capped jobs running (per 0.1 s)")
    cap_ax.set_xlabel("seconds after the first job started")
    return _finish(plt, fig, cap_ax, out_dir / "limits.png", machine, legend_size="small")


def schedules_plot(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> Path:
    """How late each slot's job started after its slot, as a cumulative share of slots, per
    profile and mode; the dashed line is one second."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for row in rows:
        late = row.get("late_ms") or []
        color, _ = MODES.get(row["mode"], ("black", "."))
        style = "-" if row.get("profile") == "defaults" else "--"
        ax.step(
            late,
            [(i + 1) / len(late) for i in range(len(late))],
            where="post",
            color=color,
            linestyle=style,
            label=f"{row['mode']}, {row.get('profile')}: p99 {row.get('late_p99_ms')} ms",
        )
    ax.axvline(1000, color="black", linestyle=":", linewidth=1, label="1 s")
    ax.set_xscale("log")
    ax.set_xlabel("job start after its slot (ms, log)")
    ax.set_ylabel("share of slots")
    ax.set_title("Recurring jobs: start after the slot (every-second schedules)")
    ax.grid(True, alpha=0.3)
    return _finish(plt, fig, ax, out_dir / "schedules.png", machine)


def workflows_plot(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> Path:
    """The delay from each job's last parent's completion to its start, as a cumulative share of
    jobs, per shape, profile and mode."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for row in rows:
        delays = row.get("delays_ms") or []
        color, _ = MODES.get(row["mode"], ("black", "."))
        style = {"chain": "-", "fan-out": "--"}.get(row["shape"], ":")
        ax.step(
            delays,
            [(i + 1) / len(delays) for i in range(len(delays))],
            where="post",
            color=color,
            linestyle=style,
            alpha=1.0 if row.get("profile") == "defaults" else 0.5,
            label=f"{row['shape']}, {row['mode']}, {row.get('profile')}: "
            f"p50 {row.get('ready_to_start_p50_ms')} ms",
        )
    ax.axvline(50, color="black", linestyle=":", linewidth=1, label="50 ms")
    ax.set_xscale("log")
    ax.set_xlabel("start after the last parent completed (ms, log)")
    ax.set_ylabel("share of jobs")
    ax.set_title("Workflows: from a parent's completion to its child's start")
    ax.grid(True, alpha=0.3)
    return _finish(plt, fig, ax, out_dir / "workflows.png", machine)


def churn_plot(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> Path:
    """Four panels over the stream's time, a line per (DISPATCHER_COMPLETED_JOBS, mode): the jobs
    table's heap and indexes (MB), its dead tuples, the claim p99, PostgreSQL's CPU per job."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10.0, 6.4), sharex=True)
    panels = (
        ("size_mb", "jobs table + indexes (MB)"),
        ("dead_tuples", "dead tuples"),
        ("claim_p99_ms", "claim p99 (ms)"),
        ("pg_cpu_us_per_job", "PostgreSQL CPU per job (µs)"),
    )
    streams = list(dict.fromkeys((r["completed_jobs"], r["mode"]) for r in rows if "at_s" in r))
    for ax, (column, title) in zip(axes.flat, panels, strict=True):
        for completed, mode in streams:
            points = [r for r in rows if (r.get("completed_jobs"), r["mode"]) == (completed, mode)]
            points = [r for r in points if "at_s" in r]
            values = [
                r["table_mb"] + r["indexes_mb"] if column == "size_mb" else r.get(column)
                for r in points
            ]
            color, marker = MODES.get(mode, ("black", "."))
            ax.plot(
                [r["at_s"] for r in points],
                values,
                color=color,
                marker=marker,
                linestyle="-" if completed == "keep" else "--",
                label=f"{completed}, {mode}",
            )
        ax.set_title(title, fontsize="medium")
        ax.grid(True, alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("seconds into the stream")
    fig.suptitle("Churn: a steady stream of jobs at the defaults")
    return _finish(plt, fig, axes[0][0], out_dir / "churn.png", machine, legend_size="small")


def citus_plot(rows: list[dict[str, Any]], out_dir: Path, machine: str) -> Path:
    """Left: jobs/s per mode, one node against the cluster (one bar pair per worker count).
    Right: each worker node's share of the buckets, of the jobs and of the worker nodes'
    PostgreSQL CPU, per mode."""
    plt = _pyplot()
    fig, (rate_ax, share_ax) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    configs = list(dict.fromkeys((r["mode"], r["workers"]) for r in rows))
    targets = list(dict.fromkeys(r["target"] for r in rows))
    at = {(r["target"], r["mode"], r["workers"]): r["jobs_per_s"] for r in rows}
    width = 0.8 / max(1, len(targets))
    for n, target in enumerate(targets):
        rate_ax.bar(
            [i + (n - (len(targets) - 1) / 2) * width for i in range(len(configs))],
            [at.get((target, mode, workers), 0) for mode, workers in configs],
            width,
            color=[MODES.get(mode, ("black", "."))[0] for mode, _ in configs],
            alpha=0.45 if n == 0 else 0.9,
            hatch="//" if n == 0 else None,
            label=target,
        )
    rate_ax.set_xticks(range(len(configs)), [f"{m} x{w}" for m, w in configs])
    rate_ax.set_ylabel("jobs/s")
    rate_ax.set_title("Drain throughput: one node vs the cluster")
    rate_ax.grid(True, alpha=0.3)
    rate_ax.legend(fontsize="small")
    shards = [
        (f"{r['mode']} x{r['workers']}\n{node['node']}", node)
        for r in rows
        for node in r.get("nodes", [])
        if r["target"] != targets[0] and node["buckets"]
    ]
    for k, (column, name) in enumerate(
        (
            ("bucket_share", "buckets"),
            ("jobs_share", "jobs"),
            ("cpu_share_of_shard_nodes", "PostgreSQL CPU"),
        )
    ):
        share_ax.bar(
            [i + (k - 1) * 0.27 for i in range(len(shards))],
            [node.get(column) or 0 for _, node in shards],
            0.27,
            color=("tab:gray", "tab:green", "tab:purple")[k],
            label=name,
        )
    share_ax.set_xticks(range(len(shards)), [name for name, _ in shards], fontsize="small")
    share_ax.set_ylim(0, 1)  # room for the legend above bars near an even share
    share_ax.set_ylabel("share of the worker nodes' total")
    share_ax.set_title("Each worker node's share")
    return _finish(plt, fig, share_ax, out_dir / "citus.png", machine, legend_size="small")
