"""The bench Job (k8s/bench): it renders and passes `kubernetes-validate --strict`, runs the fleet
bench (`python -m bench burst --external-workers`) on the workers' secret in a locked-down pod,
and the image the Dockerfile builds from this repository carries bench/ where the Job runs it.
The last is checked on the files, and by running the Job's command from a copy of bench/ alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import K8S, documents, one, render
from tests.deploy.test_k8s import KUBERNETES_VERSIONS, WORKER_SECRET, assert_locked_down, validate

BENCH = K8S / "bench"
BENCH_IMAGE = "your-registry/bucket-dispatcher"  # this repository's image, not the app's

_rendered: list[str] = []


def rendered() -> list[dict[str, Any]]:
    if not _rendered:  # one render per test session
        _rendered.append(render(BENCH))
    return documents(_rendered[0])


def container() -> dict[str, Any]:
    (only,) = one(rendered(), "Job", "dispatcher-bench")["spec"]["template"]["spec"]["containers"]
    return only


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_bench_job_is_valid_kubernetes(version: str, tmp_path: Path) -> None:
    path = tmp_path / "bench.yaml"
    path.write_text(render(BENCH))
    done = validate(path, version)
    assert done.returncode == 0, (
        f"k8s/bench against Kubernetes {version}:\n{done.stdout}{done.stderr}"
    )


def test_bench_job_runs_the_fleet_bench_once_on_the_workers_secret() -> None:
    docs = rendered()
    assert [d["kind"] for d in docs] == ["Job"], "the Job alone: the fleet is an overlay's"
    job = one(docs, "Job", "dispatcher-bench")
    spec = job["spec"]["template"]["spec"]
    assert_locked_down("Job/dispatcher-bench", spec)
    bench = container()
    argv = bench["command"] + bench["args"]
    assert argv[:5] == ["python", "-m", "bench", "burst", "--external-workers"]
    assert bench["envFrom"] == [{"secretRef": {"name": WORKER_SECRET}}], (
        "the workers' database and role"
    )
    # Never retried (a refusal or a failure is read in the log); its deadline outlasts the bench's
    # own timeout, so the bench gives up first and says why.
    assert job["spec"]["backoffLimit"] == 0 and spec["restartPolicy"] == "Never"
    assert job["spec"]["activeDeadlineSeconds"] > float(option(argv, "--timeout-s")) + 60
    # The results go to a writable emptyDir (the root filesystem is read-only).
    mounts = {m["mountPath"] for m in bench["volumeMounts"]}
    assert any(Path(option(argv, "--out")).is_relative_to(m) for m in mounts), option(argv, "--out")
    # The image comes from this repository (bench/ inside), set through `images:`.
    entry = next(
        i
        for i in yaml.safe_load((BENCH / "kustomization.yaml").read_text())["images"]
        if i["name"] == BENCH_IMAGE
    )
    assert bench["image"] == f"{entry.get('newName', BENCH_IMAGE)}:{entry['newTag']}"


def test_the_image_carries_bench_where_the_job_runs_it() -> None:
    text = (K8S.parent / "Dockerfile").read_text()
    build, final = re.split(r"(?m)^FROM ", text)[1:][0], re.split(r"(?m)^FROM ", text)[1:][-1]
    (workdir,) = re.findall(r"(?m)^WORKDIR (\S+)$", final)
    assert container()["workingDir"] == workdir
    assert re.search(rf"(?m)^COPY --from=build (\S+) {re.escape(workdir)}$", final), (
        "bench/ copied to WORKDIR"
    )
    assert re.search(r"cp -r bench ", build), "the build stage collects bench/"
    ignored = (K8S.parent / ".dockerignore").read_text().split()
    assert not {"bench", "bench/", "bench/*", "bench/**"} & set(ignored), (
        "bench/ reaches the build context"
    )


def test_the_jobs_command_runs_from_a_copy_of_bench_alone(tmp_path: Path) -> None:
    """As in the image: bench/ in the working directory, bucket-dispatcher installed, no checkout.
    Its arguments parse, and with no database listening it fails (exit 1) in one line, naming it."""
    shutil.copytree(
        K8S.parent / "bench",
        tmp_path / "bench",
        ignore=shutil.ignore_patterns("__pycache__", "out", "results"),
    )
    bench = container()
    argv = [sys.executable if a == "python" else a for a in bench["command"] + bench["args"]]
    argv[argv.index("--out") + 1] = str(tmp_path / "out")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DISPATCHER_DSN")}
    env["DISPATCHER_DSN"] = "postgresql://app_worker@127.0.0.1:1/app?connect_timeout=5"
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    errors = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        len(errors) == 1 and errors[0].startswith("bench: failed:") and "127.0.0.1" in errors[0]
    ), errors
