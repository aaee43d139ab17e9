"""The web console's first render of a 2,000-step run in headless Chromium.

Run ``python -m benchmarks.console [--json] [--reps R]`` from the repository root (needs
Debian's ``chromium`` and the ``playwright`` package of the ``test`` extra; no browser
download). A private Valkey, one runtime host and the control plane with its API and
console are served over TCP (the test suite's ``ServedControlPlane``); three runs are
submitted and waited for: a 2,000-step fan-out (root -> 1,998 -> sink: its middle layer
is one summary node), a random 2,000-step DAG (three parents at most; wide layers
collapse), a 2,000-step chain (drawn as bands of layers) -- and a 3-step run, the floor
measured in the same process on the same machine.

Each run page is opened ``R`` times in a fresh tab, signed in; the figure is the
navigation's ``loadEventEnd`` (HTML parsed, CSS and the module script loaded, the SVG
laid out: the page is usable; the timeline and ledger load after it), the first
contentful paint, and the time until the timeline and ledger are in. Printed: the
median per shape, its ratio to the floor, and whether the first render is under the
2 s target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx

from airuntime.control_plane.settings import ControlPlaneSettings
from tests.conftest import _start
from tests.dags import chain, fan, random_dag
from tests.runs.served import ServedControlPlane

CHROMIUM = "/usr/bin/chromium"
TARGET_MS = 2000.0
TOKEN = "token-alice-a"
TIMING_JS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  const nodes = document.querySelectorAll('#dag .node').length;
  return [nav.loadEventEnd, fcp ? fcp.startTime : null, nodes, performance.now()];
}"""
COMPLETE_JS = """() => document.querySelector('#gantt svg, #gantt > p:not(.muted)')
  && document.querySelector('#ledger table')"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pipeline(name: str, deps: dict[str, list[str]]) -> dict[str, Any]:
    steps = [{"id": s, "uses": "noop", "depends_on": ds} for s, ds in deps.items()]
    return {"id": name, "steps": steps}


SHAPES = {
    "floor-3-steps": {"a": [], "b": ["a"], "c": ["b"]},
    "fan-out-2000": fan(1998),
    "random-dag-2000": random_dag(2000, seed=15),
    "chain-2000": chain(2000),
}


def submit_all(api: httpx.Client) -> dict[str, str]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    runs = {}
    for name, deps in SHAPES.items():
        resp = api.post("/v1/runs", json={"pipeline": pipeline(name, deps)}, headers=headers)
        resp.raise_for_status()
        runs[name] = resp.json()["shared_run_id"]
    deadline = time.monotonic() + 600
    for name, srid in runs.items():
        while api.get(f"/v1/runs/{srid}", headers=headers).json()["status"] != "Succeeded":
            if time.monotonic() > deadline:
                raise SystemExit(f"{name} did not finish")
            time.sleep(0.2)
        log(f"{name}: {srid} succeeded")
    return runs


def measure(url: str, runs: dict[str, str], reps: int) -> dict[str, dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, dict[str, Any]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        login = context.new_page()
        login.goto(f"{url}/ui/login")
        login.get_by_label("API token").fill(TOKEN)
        login.get_by_role("button", name="Sign in").click()
        login.wait_for_url("**/ui/runs")
        for name, srid in runs.items():
            loads, paints, completes = [], [], []
            nodes = 0
            for _ in range(reps + 1):  # the first one warms the server's caches
                page = context.new_page()
                page.goto(f"{url}/ui/runs/{srid}", wait_until="load")
                # The timeline and ledger load after the page; wait for them, so the next
                # navigation does not queue behind this one's requests on the server.
                page.wait_for_function(COMPLETE_JS, timeout=60_000)
                load, paint, nodes, complete = page.evaluate(TIMING_JS)
                loads.append(load)
                paints.append(paint or load)
                completes.append(complete)
                page.close()
            out[name] = {
                "load_ms": round(statistics.median(loads[1:]), 1),
                "first_paint_ms": round(statistics.median(paints[1:]), 1),
                "with_timeline_and_ledger_ms": round(statistics.median(completes[1:]), 1),
                "drawn_nodes": nodes,
            }
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with _start("valkey", None) as info, tempfile.TemporaryDirectory() as tmp:
        served = ServedControlPlane(
            info.url, f"sqlite:///{tmp}/history.db", ControlPlaneSettings(scale_out_enabled=False)
        )
        served.start()
        try:
            with httpx.Client(base_url=served.url, timeout=60) as api:
                runs = submit_all(api)
            results = measure(served.url, runs, args.reps)
        finally:
            served.stop()
    floor = results["floor-3-steps"]["load_ms"] or 1.0
    for row in results.values():
        row["ratio_to_floor"] = round(row["load_ms"] / floor, 2)
        row["under_target"] = row["load_ms"] < TARGET_MS
    if args.json:
        print(json.dumps({"target_ms": TARGET_MS, "reps": args.reps, "results": results}, indent=2))
        return
    for name, row in results.items():
        print(
            f"{name:18} load {row['load_ms']:8.1f} ms  first paint {row['first_paint_ms']:8.1f} ms"
            f"  all {row['with_timeline_and_ledger_ms']:8.1f} ms"
            f"  x{row['ratio_to_floor']:<5} nodes {row['drawn_nodes']:4}"
            f"  {'under' if row['under_target'] else 'OVER'} {TARGET_MS:.0f} ms"
        )


if __name__ == "__main__":
    main()
