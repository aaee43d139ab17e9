"""The shipped Grafana dashboard and the chart's alerting rules, evaluated by a real
Prometheus scraping a real control plane and two runtime processes while runs execute.

* Every panel query of ``helm/airuntime/dashboards/airuntime.json`` (template variables
  substituted as Grafana does, see :func:`tests.observability.stack.grafana_expr`) is
  run as a range query over the workload and must be valid and return series; the
  queries filtered by ``$tenant`` must also return series for one chosen tenant, and the
  ``$tenant`` variable's own query must list the tenants.
* The chart's PrometheusRule, rendered by the real ``helm`` (short test thresholds),
  is loaded into Prometheus: every rule must load and evaluate without error, and each
  alert must fire for the condition provoked on purpose -- ``starved``'s run queued with
  no Ready instance and failing scale-outs, a history nobody listens on (archive backlog,
  failing archiver loop) -- and not for the healthy tenants.
* The dashboard picture (``benchmarks/dashboard_png.py``) is rendered from this
  Prometheus. ``AIRUNTIME_DASHBOARD_PNG=docs/images/dashboard.png`` writes it where the
  README shows it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.e2e.test_chart import helm  # noqa: F401  (the pinned helm binary fixture)
from tests.engine.model_server import model_server
from tests.observability.stack import (
    CHART,
    ObservedCluster,
    Prometheus,
    chart_rules,
    dashboard_targets,
    grafana_expr,
    wait_for,
)

pytestmark = [pytest.mark.timeout(900), pytest.mark.asyncio(loop_scope="module")]

BOARD: dict[str, Any] = json.loads((CHART / "dashboards" / "airuntime.json").read_text())

RETRIES = {
    "id": "obs-retries",
    "steps": [
        {
            "id": "flaky",
            "uses": "fail",
            "with": {"fail_attempts": 1, "value": "ok"},
            "retry": {"max_attempts": 3, "backoff_initial_s": 0.05},
        },
        {"id": "after", "uses": "echo", "with": {"value": "${steps.flaky.output}"}},
    ],
}
FAN = {
    "id": "obs-fan",
    "steps": [
        {"id": "root", "uses": "noop"},
        *({"id": f"s{i}", "uses": "sleep", "with": {"seconds": 0.2}, "depends_on": ["root"]}
          for i in range(4)),
    ],
}  # fmt: skip

ASK = {
    "id": "obs-ask",
    "steps": [
        {"id": "draft", "uses": "model",
         "with": {"provider": "local", "model": "m", "prompt": "a b"}},
        {"id": "review", "uses": "model",
         "with": {"provider": "local", "model": "m", "prompt": "${steps.draft.output.text}"}},
    ],
}  # fmt: skip

WAVES, RUNS_PER_WAVE = 4, 12


def _wave_pipeline(i: int) -> dict[str, Any]:
    """The ``i``-th run of a wave (tenants alternate): retries, model calls, fan-outs."""
    return RETRIES if i % 3 == 0 else ASK if i % 3 == 1 else FAN


@dataclass
class Observed:
    cluster: ObservedCluster
    prometheus: Prometheus
    rules: list[dict[str, Any]]
    started: float
    starved_run: str


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def observed(
    helm: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Observed]:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed (.ci/run installs it)")
    root = tmp_path_factory.mktemp("observed")
    models = model_server()  # the platform's model provider `local`, for the ASK runs
    server = models.__enter__()
    cluster = ObservedCluster(root, model_url=server.openai_url)
    prometheus = Prometheus(root / "prometheus")
    prometheus.root.mkdir()
    rules_file, rules = chart_rules(helm, root)
    try:
        await cluster.start()
        jobs = {
            "airuntime-control-plane": [f"127.0.0.1:{cluster.api_port}"],
            "airuntime-runtime": await cluster.runtime_targets(),
        }
        await prometheus.start(jobs, rules_file)
        started = time.time()
        await wait_for(lambda: _all_targets_up(prometheus), 60, "every target scraped and up")
        starved = await cluster.submit_as("starved", FAN)
        for _wave in range(WAVES):  # a few waves: the panels show a stretch of time
            runs = []
            for i in range(RUNS_PER_WAVE):
                tenant = ("default", "tenant-a")[i % 2]
                runs.append(await cluster.submit_as(tenant, _wave_pipeline(i)))
            for srid in runs:

                async def ended(s: str = srid) -> bool:
                    return await cluster.status(s) in {"Succeeded", "Failed", "Cancelled"}

                await wait_for(ended, 120, f"run {srid} ended")
                assert await cluster.status(srid) == "Succeeded"
        # Until a scrape after the last run shows every step of it.
        per_wave = sum(len(_wave_pipeline(i)["steps"]) + (i % 3 == 0)
                       for i in range(RUNS_PER_WAVE))  # fmt: skip  # + each retried attempt
        steps = WAVES * per_wave
        await wait_for(
            lambda: _at_least(prometheus, "sum(airuntime_steps_total)", steps),
            60,
            f"{steps} step attempts scraped",
        )
        # ... and the provoked faults: starved's scale-out failed twice (its backoff).
        await wait_for(
            lambda: _at_least(
                prometheus, 'sum(airuntime_scale_out_failures_total{tenant="starved"})', 2
            ),
            90,
            "two failed scale-outs of starved scraped",
        )
        yield Observed(cluster, prometheus, rules, started, starved)
    finally:
        await prometheus.stop()
        await cluster.stop()
        models.__exit__(None, None, None)


async def _all_targets_up(prometheus: Prometheus) -> bool:
    active = (await prometheus.api("targets"))["activeTargets"]
    return len(active) == 3 and all(t["health"] == "up" for t in active)


async def _at_least(prometheus: Prometheus, expr: str, n: float) -> bool:
    result = await prometheus.query(expr)
    return bool(result) and float(result[0]["value"][1]) >= n


async def test_every_dashboard_query_returns_series(observed: Observed) -> None:
    end = time.time()
    range_s = end - observed.started
    empty, checked = [], 0
    for title, ref, expr in dashboard_targets(BOARD):
        query = grafana_expr(expr, range_s=range_s)
        result = await observed.prometheus.query_range(query, observed.started, end)
        checked += 1
        if not result:
            empty.append(f"{title} [{ref}]: {query}")
    assert checked >= 30, checked
    assert not empty, "panel queries without series:\n" + "\n".join(empty)


async def test_tenant_variable_lists_tenants_and_filters_panels(observed: Observed) -> None:
    variable = next(v for v in BOARD["templating"]["list"] if v["name"] == "tenant")
    metric = variable["query"]["query"].removeprefix("label_values(").split(",")[0]
    listed = await observed.prometheus.api("label/tenant/values", **{"match[]": metric})
    assert {"default", "tenant-a", "starved"} <= set(listed)
    end = time.time()
    filtered = [(t, r, e) for t, r, e in dashboard_targets(BOARD) if "$tenant" in e]
    assert len(filtered) >= 4
    for title, ref, expr in filtered:
        # starved runs nothing: the panels of what runs show another tenant, alone too.
        tenant = "tenant-a" if "airuntime_model_" in expr else "starved"
        query = grafana_expr(expr, range_s=end - observed.started, tenant=tenant)
        result = await observed.prometheus.query_range(query, observed.started, end)
        tenants = {s["metric"].get("tenant") for s in result}
        assert tenants == {tenant}, f"{title} [{ref}] with tenant={tenant}: {tenants}"


async def test_every_alert_rule_loads_and_evaluates(observed: Observed) -> None:
    names = {r["alert"] for r in observed.rules}
    assert names == {
        "AiruntimeQueuedRunTooOld",
        "AiruntimeNoReadyInstance",
        "AiruntimeLoopFailing",
        "AiruntimeScaleOutFailing",
        "AiruntimeArchiveBacklog",
    }

    async def evaluated() -> bool:
        groups = (await observed.prometheus.api("rules"))["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        return {r["name"] for r in loaded} == names and all(
            r["health"] == "ok" and r.get("lastEvaluation", "").startswith("2") for r in loaded
        )

    await wait_for(evaluated, 30, "every rule loaded, evaluated, healthy")
    for rule in observed.rules:
        await observed.prometheus.query(rule["expr"])  # asserts status success


EXPECTED_FIRING = {
    ("AiruntimeQueuedRunTooOld", "tenant", "starved"),
    ("AiruntimeNoReadyInstance", "tenant", "starved"),
    ("AiruntimeScaleOutFailing", "tenant", "starved"),
    ("AiruntimeArchiveBacklog", "kind", "execution"),
    ("AiruntimeLoopFailing", "loop", "archiver"),
}


async def test_provoked_conditions_fire_their_alerts(observed: Observed) -> None:
    async def firing() -> set[tuple[str, str, str]]:
        alerts = (await observed.prometheus.api("alerts"))["alerts"]
        return {
            (a["labels"]["alertname"], key, a["labels"].get(key, ""))
            for a in alerts
            if a["state"] == "firing"
            for key in ("tenant", "kind", "loop")
        }

    async def all_fire() -> bool:
        return await firing() >= EXPECTED_FIRING

    try:
        await wait_for(all_fire, 90, "every provoked alert firing")
    finally:
        now = await firing()
        print("firing:", sorted(now))
    assert now >= EXPECTED_FIRING, EXPECTED_FIRING - now
    for healthy in ("default", "tenant-a"):
        for alert in ("AiruntimeQueuedRunTooOld", "AiruntimeNoReadyInstance"):
            assert (alert, "tenant", healthy) not in now
    assert await observed.cluster.status(observed.starved_run) in {
        "QueuedGlobally",
        "ScaleOutRequested",
    }


async def test_dashboard_picture_renders(observed: Observed, tmp_path: Path) -> None:
    from benchmarks.dashboard_png import render

    target = Path(os.environ.get("AIRUNTIME_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    drawn = await asyncio.to_thread(
        render, observed.prometheus.url, BOARD, observed.started, time.time(), target
    )
    head = await asyncio.to_thread(target.read_bytes)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(drawn) >= 6 and all(n > 0 for n in drawn.values()), drawn
