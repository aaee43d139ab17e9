# syntax=docker/dockerfile:1
#
# airuntime image: one image for every process; the command picks which one.
#
#   version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
#   docker build --build-arg AIRUNTIME_VERSION="$version" -t "airuntime:$version" .
#   docker run --rm "airuntime:$version" control-plane     # airt control-plane
#   docker run --rm "airuntime:$version" runtime           # airt runtime
#   docker run --rm "airuntime:$version" operator          # airt operator
#
# The version lives in pyproject.toml only; the image's version label takes it from
# the AIRUNTIME_VERSION build argument.
#
# Stage 1 (builder) installs the project and all its dependencies (with the
# `kubernetes` extra: kopf and the kubernetes client, which the operator and the
# control plane's `kubernetes` scale-out provider need) into a virtualenv at
# /opt/airuntime, dependencies first in a layer of their own. Stage 2 copies that
# virtualenv into a slim Python image without compilers (same base, same interpreter
# path) and runs as an unprivileged user (uid/gid 10001, the uid the Helm chart and
# the operator's pod templates enforce with runAsNonRoot). COPY --from is keyed by
# content in every builder (docker BuildKit and buildah alike), so a source change can
# never ship a stale install. No HEALTHCHECK: Kubernetes probes /healthz and /readyz
# (see the chart).

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# A compiler only for dependencies that publish no wheel for this platform;
# it stays in this stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
RUN python -m venv /opt/airuntime
ENV PATH=/opt/airuntime/bin:$PATH

# The dependencies first, in a layer of their own: a rebuild after a source change
# reuses it, and only a change of pyproject.toml downloads and builds them again.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['kubernetes']))" \
        >/tmp/requirements.txt \
    && pip install --no-compile -r /tmp/requirements.txt

COPY README.md ./
COPY airuntime ./airuntime
COPY runtime_pod ./runtime_pod
COPY operator ./operator

# The bytecode is compiled here (the root filesystem is read-only at run time). What
# nothing in the image imports goes before that: the kubernetes client's asyncio twin
# (kubernetes.aio, 42 MB of source and as much again of bytecode; airuntime uses the
# synchronous client) and the installers (pip, setuptools: the image never installs).
RUN pip install --no-deps --no-compile . \
    && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && rm -rf "$site/kubernetes/aio" \
    && python -m compileall -q -j 0 "$site" \
    && pip uninstall -q -y pip setuptools

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

ARG AIRUNTIME_VERSION=unknown

LABEL org.opencontainers.image.title="airuntime" \
      org.opencontainers.image.description="Deterministic runtime for AI workflows: control plane, runtime instances and Kubernetes operator" \
      org.opencontainers.image.version="${AIRUNTIME_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# AIRUNTIME_HOME and HOME live under /tmp: the chart mounts a writable emptyDir
# there and keeps the root filesystem read-only. In a container the HTTP servers
# listen on every interface (outside one, the default is 127.0.0.1).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    AIRUNTIME_HOME=/tmp/airuntime \
    AIRUNTIME_API_HOST=0.0.0.0 \
    AIRUNTIME_HTTP_HOST=0.0.0.0

RUN groupadd --system --gid 10001 airuntime \
    && useradd --system --uid 10001 --gid 10001 \
        --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin airuntime

COPY --from=builder /opt/airuntime /opt/airuntime
ENV PATH=/opt/airuntime/bin:$PATH
RUN airt --help >/dev/null && python -c "import airuntime_operator, runtime_pod"

WORKDIR /tmp
USER 10001:10001

# 8780: control-plane HTTP API; 8080: runtime pods' HTTP (and the operator's probe).
EXPOSE 8780 8080

ENTRYPOINT ["airt"]
CMD ["--help"]
