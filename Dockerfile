# syntax=docker/dockerfile:1
# An example image for YOUR app: copy this file and .dockerignore into your app's repository,
# whose pyproject.toml (or setup.py) depends on bucket-dispatcher, and build there:
#   docker build -t registry.example.com/myapp:1.4.0 .
# Built from this repository as it is, it gives an image of bucket-dispatcher alone, which runs
# the demo handlers: `dispatcher run --app dispatcher.devtools.demo_app:registry`, and the bench
# suite: `python -m bench burst --external-workers` from /app (the Job in k8s/bench).
# Every image gets two extras: `binary` (psycopg's wheel with libpq inside: the slim image has no
# libpq, and psycopg cannot import without one) and `redis` (the partitioned-redis overlay runs
# this same image). EXTRAS names more (comma-separated), none by default, so the workers' image
# stays lean. The web dashboard's image (k8s/components/web) is built from this repository with
# its `web` extra (Starlette, uvicorn, Jinja2), under a name of its own:
#   docker build --build-arg EXTRAS=web -t registry.example.com/bucket-dispatcher-web:0.1.0 .
# Your app's pyproject.toml depends on `bucket-dispatcher[binary,redis]` to the same end.
#
# Two stages: the first installs the project and its dependencies into a virtualenv (compilers,
# if a dependency has no wheel, go here only); the second copies that virtualenv onto a clean
# slim image with a non-root user. The uid/gid 10001 is the runAsUser of k8s/base.
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# The same path in both stages: the virtualenv's scripts name their interpreter by absolute path.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
ARG EXTRAS=""
# The dependencies first, those of the extras installed below included, so an edit of the code
# alone reuses this layer (a project without a static [project] dependencies list just installs
# everything in the next step).
COPY pyproject.toml ./
RUN python - <<'PY' > /tmp/requirements.txt
import os, tomllib
project = tomllib.load(open("pyproject.toml", "rb")).get("project", {})
extras = project.get("optional-dependencies", {})
wanted = ["binary", "redis", *filter(None, os.environ.get("EXTRAS", "").split(","))]
print("\n".join(project.get("dependencies", []) + [r for e in wanted for r in extras.get(e, [])]))
PY
RUN pip install -r /tmp/requirements.txt
COPY . .
# Compiled to bytecode here: the root filesystem is read-only at run time. With EXTRAS=web this is
# `pip install ".[binary,redis,web]"`; empty, `pip install ".[binary,redis]"`.
RUN pip install ".[binary,redis${EXTRAS:+,$EXTRAS}]" && python -m compileall -q /opt/venv
# The bench suite is no package of the wheel (the runtime stays clean): when this repository is
# built, bench/ goes to /opt/app, the final stage's working directory, where `python -m bench`
# finds it. Your app's repository has no bench/: /opt/app stays empty.
RUN mkdir /opt/app && if [ -d bench ]; then cp -r bench /opt/app/ && python -m compileall -q /opt/app; fi

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/app /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app
# Numeric, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 9464
# The manifests give the command (`dispatcher run --app myapp.jobs:registry`); this is a reminder.
CMD ["dispatcher", "--help"]
