"""A real airuntime system scraped by a real Prometheus, for the dashboard and alert tests.

Why this module exists: a Grafana dashboard or an alerting rule is only known to work
once a Prometheus evaluated it against what the processes really export. This starts
the chaos test's system (:class:`tests.chaos.cluster.Cluster`: Valkey, ``airt
control-plane``, two ``airt runtime`` processes) with three tenants and faults that the
alerts must see -- a tenant (``starved``) whose only runtime cannot start (its scale-out
fails, its run stays queued with no Ready instance), and a durable history nobody listens
on (the archivers fail, the backlog grows) -- and Debian's ``prometheus`` scraping the
control plane and both runtimes every second, with the chart's rules loaded.

Grafana's template variables are substituted the way Grafana does it
(:func:`grafana_expr`), so the test evaluates the dashboard's queries as Grafana would.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from airuntime.control_plane.shared_runs import SharedRunStore
from airuntime.core import keys
from airuntime.devstack.child_process import free_port
from tests.chaos.cluster import API_TOKEN, Cluster, ClusterConfig, Proc, retrying, until

ADMIN = API_TOKEN  # the token of the cluster's own API client
TENANT_TOKENS = {
    "default": "obs-default-token",
    "tenant-a": "obs-a-token",
    "starved": "obs-s-token",
}
PREFIX = "obs"
SCRAPE_S = 1
CHART = Path(__file__).resolve().parents[2] / "helm" / "airuntime"
HANDLERS = ["noop", "sleep", "echo", "fail", "model"]

RULE_OVERRIDES = {
    # Short thresholds and `for`s, so that the provoked conditions fire within seconds;
    # the expressions are the chart's own.
    "queueAge": {"seconds": 2, "for": "2s"},
    "noReadyInstance": {"for": "2s"},
    "loopErrors": {"errors": 0, "window": "1m", "for": "0s"},
    "scaleOutFailures": {"window": "1m", "for": "0s"},
    "archiveBacklog": {"items": 0, "for": "2s"},
}


def tenants() -> list[dict[str, Any]]:
    shared = {"isolation_mode": "Shared", "runtime_prefix": PREFIX, "max_instances": 2}
    return [
        {"tenant_id": "default", **shared, "allowed_handlers": HANDLERS},
        {"tenant_id": "tenant-a", **shared, "allowed_handlers": HANDLERS},
        {
            "tenant_id": "starved",
            "isolation_mode": "Dedicated",
            "allow_shared_fallback": False,
            "runtime_prefix": "starved",
            "max_instances": 1,
            "allowed_handlers": HANDLERS,
        },
    ]


@dataclass
class ObservedCluster(Cluster):
    """The chaos cluster with this test's tenants, tokens and faults."""

    config: ClusterConfig = field(default_factory=lambda: ClusterConfig(runtimes=2))
    model_url: str = ""
    """An OpenAI-compatible server: the platform's model provider ``local``, if set."""

    def _env(self, **extra: str) -> dict[str, str]:
        if self.model_url:
            providers = {"local": {"base_url": self.model_url}}
            extra.setdefault("AIRUNTIME_MODEL_PROVIDERS", json.dumps(providers))
        return super()._env(**extra)

    def _write_config(self) -> None:
        tokens = [{"token": ADMIN, "user": "ops", "tenant": "default", "roles": ["admin"]}]
        tokens += [
            {"token": tok, "user": f"u-{t}", "tenant": t, "roles": ["submitter"]}
            for t, tok in TENANT_TOKENS.items()
        ]
        (self.root / "tokens.json").write_text(json.dumps({"tokens": tokens}))
        (self.root / "tenants.json").write_text(json.dumps({"tenants": tenants()}))

    async def start_control_plane(self) -> None:
        home = self.root / "cp"
        home.mkdir(exist_ok=True)
        env = self._env(
            AIRUNTIME_HOME=str(home),
            AIRUNTIME_API_PORT=str(self.api_port),
            AIRUNTIME_TOKENS_FILE=str(self.root / "tokens.json"),
            AIRUNTIME_TENANTS_FILE=str(self.root / "tenants.json"),
            AIRUNTIME_BACKGROUND_PUMP="true",
            AIRUNTIME_SCALE_OUT_ENABLED="true",
            AIRUNTIME_SCALE_OUT_PROVIDER="local",
            AIRUNTIME_SCALE_OUT_BACKOFF_INITIAL_S="1",
            AIRUNTIME_SCALE_OUT_BACKOFF_MAX_S="2",
            # The runtime the local scaler starts inherits this invalid lease (minimum
            # 100 ms) and exits 2: every scale-out for ``starved`` fails.
            AIRUNTIME_LEASE_MS="50",
            # A history nobody listens on: the archivers fail and their backlog grows.
            AIRUNTIME_HISTORY_DSN=f"postgresql://airt@127.0.0.1:{free_port()}/none",
            AIRUNTIME_HISTORY_TIMEOUT_S="0.5",
        )
        self.control_plane = await self._spawn("control-plane", ["control-plane"], env)
        await self.wait_ready_or_degraded()

    async def wait_ready_or_degraded(self) -> None:
        """Until the API answers (``/readyz`` may be 503: the archivers fail by design)."""

        async def up() -> bool:
            try:
                return (await self.api.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        await until(up, 60, "the control plane serving", self.control_plane)

    async def runtime_targets(self) -> list[str]:
        """``host:port`` of every runtime's HTTP server (``/metrics``)."""
        targets = []
        for iid in self.runtimes:
            raw = await retrying(lambda i=iid: self.redis.get(keys.instance(i)))
            assert raw, f"{iid} is not registered"
            targets.append(httpx.URL(json.loads(raw)["endpoint"]).netloc.decode())
        return targets

    async def submit_as(self, tenant: str, doc: dict[str, Any]) -> str:
        r = await self.api.post(
            "/v1/runs",
            json={"pipeline": doc},
            headers={"authorization": f"Bearer {TENANT_TOKENS[tenant]}"},
        )
        assert r.status_code == 202, f"submit as {tenant}: {r.status_code} {r.text}"
        return str(r.json()["shared_run_id"])

    async def status(self, srid: str) -> str:
        """The shared run's status as Redis holds it. (The API's run reads consult the
        durable history, which this system has down on purpose.)"""
        run = await SharedRunStore(self.redis).get(srid)
        assert run is not None, srid
        return run.status.value


# -- Prometheus ---------------------------------------------------------------------------


@dataclass
class Prometheus:
    """Debian's ``prometheus`` on a free port with a 1 s scrape and evaluation interval."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, jobs: dict[str, list[str]], rules: Path) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed (.ci/run installs Debian's package)"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                # honor_labels as the chart's ServiceMonitor: a runtime's `instance` label
                # is its runtime instance id.
                {"job_name": job, "honor_labels": True, "static_configs": [{"targets": targets}]}
                for job, targets in jobs.items()
            ],
        }
        path = self.root / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        log = self.root / "prometheus.log"
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={path}",
                f"--storage.tsdb.path={self.root / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                stdout=out,
                stderr=out,
            )
        self.proc = Proc("prometheus", process, log)

        async def ready() -> bool:
            try:
                async with httpx.AsyncClient() as c:
                    return (await c.get(f"{self.url}/-/ready")).status_code == 200
            except httpx.HTTPError:
                return False

        await until(ready, 60, "prometheus ready", self.proc)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.process.returncode is None:
            self.proc.process.send_signal(signal.SIGTERM)
            await self.proc.process.wait()

    async def api(self, path: str, **params: Any) -> Any:
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.get(f"{self.url}/api/v1/{path}", params=params)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {r.status_code} {body}"
        return body["data"]

    async def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        data = await self.api("query_range", query=expr, start=start, end=end, step=SCRAPE_S)
        return list(data["result"])

    async def query(self, expr: str) -> list[dict[str, Any]]:
        return list((await self.api("query", query=expr))["result"])


# -- Grafana's substitution ---------------------------------------------------------------


def rate_interval_s(range_s: float, max_data_points: int = 1000) -> int:
    """Grafana's ``$__rate_interval``: ``max($__interval + scrape, 4 * scrape)`` where
    ``$__interval`` is the range over the panel's data points, at least the data
    source's scrape interval (set to the test Prometheus's, 1 s)."""
    interval = max(SCRAPE_S, round(range_s / max_data_points))
    return max(interval + SCRAPE_S, 4 * SCRAPE_S)


def _regex_value(value: str) -> str:
    """A variable's value in a regex matcher as Grafana's Prometheus data source writes it
    (``prometheusRegularEscape``): each regex metacharacter behind two backslashes, the
    PromQL string's escape of one (Python's ``re.escape`` also escapes ``-``, with one
    backslash: not a PromQL string escape, so ``tenant-a`` was a parse error)."""
    return re.sub(r"([\\^$*+?.()|{}\[\]'])", r"\\\\\1", value)


def grafana_expr(expr: str, *, range_s: float, tenant: str | None = None) -> str:
    """``expr`` as Grafana sends it: ``$__rate_interval``/``$__interval``/``$__range`` in
    seconds, ``$tenant`` as the variable's All value (``.*``, its ``allValue``) or one
    tenant (regex-escaped, as Grafana formats a single value of a regex matcher)."""
    interval = max(SCRAPE_S, round(range_s / 1000))
    values = {
        "__rate_interval": f"{rate_interval_s(range_s)}s",
        "__interval": f"{interval}s",
        "__range": f"{round(range_s)}s",
        "tenant": ".*" if tenant is None else _regex_value(tenant),
    }

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown Grafana variable ${name} in {expr}"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)


def dashboard_targets(board: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel."""
    return [
        (p["title"], t["refId"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])
    ]


# -- the chart's rules --------------------------------------------------------------------


def chart_rules(helm: str, root: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Render the chart's PrometheusRule with the real helm (test thresholds) and write
    its groups as a Prometheus rule file; returns the file and its rules."""
    values = {"metrics": {"prometheusRule": {"enabled": True, **RULE_OVERRIDES}}}
    values_file = root / "rule-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    argv = [helm, "template", "rel", str(CHART), "--values", str(values_file)]
    argv += ["--show-only", "templates/prometheusrule.yaml"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    (doc,) = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert doc["kind"] == "PrometheusRule"
    path = root / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    return path, [r for g in doc["spec"]["groups"] for r in g["rules"]]


async def wait_for(probe: Any, timeout_s: float, what: str) -> None:
    """Poll an external system (Prometheus) until ``probe()`` is truthy."""
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what}")
        await asyncio.sleep(0.25)
