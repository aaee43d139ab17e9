"""Run reads, hot vs archived: what a view of a run costs from Redis and from the archive.

Run ``python -m benchmarks.run_reads [--json] [--steps N] [--reps R]`` from the
repository root. A private embedded Valkey and a SQLite history in a temporary
directory are used; one control plane and one runtime host run in-process and the API
is called through httpx's ASGI transport (no network).

Set-up: one run of a fan-out pipeline (root -> N-2 parallel noops -> sink) is submitted
and waited for; then each view (``GET /v1/runs/{id}``, ``/trace``, ``/report``, the
whole ledger through ``/events?limit=999`` pages) is read ``R`` times while the run is
hot in Redis; then the run is archived exactly as Redis holds it (the archiver's
contract), its hot keys are deleted, and the same reads are repeated from the archive.
Every archived answer is checked to equal the hot one.

Printed per view: the median milliseconds hot and archived, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

from airuntime.control_plane.api import create_app
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.core import keys
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.history import (
    ArchivedEvent,
    ArchivedExecution,
    ArchivedSharedRun,
    HistoryStore,
    open_history_store,
)
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost

HEADERS = {"authorization": "Bearer token-bench"}
VIEWS = ("", "/trace", "/report", "/events")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fan(steps: int) -> dict[str, Any]:
    middle = [f"s{i}" for i in range(steps - 2)]
    specs: list[dict[str, Any]] = [{"id": "root", "uses": "noop"}]
    specs += [{"id": m, "uses": "noop", "depends_on": ["root"]} for m in middle]
    specs.append({"id": "sink", "uses": "noop", "depends_on": middle})
    return {"id": "fan", "steps": specs}


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def archive(redis: Redis, store: HistoryStore, srid: str) -> None:
    """Archive the run as Redis holds it and delete its hot keys (the archiver's job)."""
    run = json.loads(await redis.get(keys.shared_run(srid)))
    eid = run["execution_id"]
    ek = keys.execution_keys(eid)
    meta = {_s(k): _s(v) for k, v in (await redis.hgetall(ek.meta)).items()}
    events = []
    for seq, (entry_id, fields) in enumerate(await redis.xrange(ek.events)):
        f = {_s(k): _s(v) for k, v in fields.items()}
        events.append(ArchivedEvent(eid, seq, _s(entry_id), f.pop("type"), f))
    snapshot = json.loads(await redis.get(ek.snapshot))
    record = ArchivedExecution(
        execution_id=eid,
        tenant_id=meta["tenant_id"],
        pipeline_id=meta["pipeline_id"],
        status=snapshot["status"],
        created_ms=int(meta["created_at"]),
        finished_ms=int(meta["finished_at"]),
        plan=json.loads(await redis.get(ek.plan)),
        inputs=json.loads(meta.get("inputs") or "{}"),
        context=json.loads(meta.get("context") or "{}"),
        snapshot=snapshot,
        shared_run_id=srid,
        run_id=run["run_id"],
    )
    await store.upsert_execution(record, events)
    tenant = run["snapshot"]["tenant_id"]
    await store.upsert_shared_run(
        ArchivedSharedRun(
            srid, tenant, run["pipeline_id"], run["status"], run["created_at_ms"],
            run["finished_at_ms"], run,
        )
    )  # fmt: skip
    await redis.delete(*ek.all(), keys.shared_run(srid))


async def read(client: httpx.AsyncClient, srid: str, view: str) -> Any:
    if view != "/events":
        return (await client.get(f"/v1/runs/{srid}{view}", headers=HEADERS)).json()
    events: list[Any] = []
    params: dict[str, Any] = {"limit": 999}
    while True:
        page = (await client.get(f"/v1/runs/{srid}/events", params=params, headers=HEADERS)).json()
        events += page["events"]
        if page["next_cursor"] is None:
            return events
        params["cursor"] = page["next_cursor"]


async def timed(client: httpx.AsyncClient, srid: str, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for view in VIEWS:
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            body = await read(client, srid, view)
            samples.append((time.perf_counter() - start) * 1000)
        out[view or "/"] = (statistics.median(samples), body)
    return out


async def scenario(url: str, history_dsn: str, steps: int, reps: int) -> dict[str, Any]:
    redis = Redis.from_url(url)
    await redis.flushdb()
    store = await open_history_store(history_dsn)
    host = RuntimeHost(redis, InstanceConfig(workers=8, heartbeat_s=0.5), instances=1)
    await host.start()
    cp = ControlPlane(redis, ControlPlaneSettings(scale_out_enabled=False))
    for inst in host.instances:
        cp.local.add(inst)
    await cp.start()
    auth = Authenticator([TokenEntry(token="token-bench", user="b", tenant="t", roles=["admin"])])
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(cp, auth, history=store)), base_url="http://cp"
    )
    try:
        sub = await client.post("/v1/runs", json={"pipeline": fan(steps)}, headers=HEADERS)
        srid = sub.json()["shared_run_id"]
        deadline = time.monotonic() + 600
        while (await read(client, srid, ""))["status"] not in ("Succeeded", "Failed"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{srid} did not end within 600 s")
            await asyncio.sleep(0.05)
        hot = await timed(client, srid, reps)
        await archive(redis, store, srid)
        cold = await timed(client, srid, reps)
    finally:
        await client.aclose()
        await cp.stop()
        await host.stop()
        await store.close()
        await redis.aclose()
    rows = {}
    for view, (hot_ms, body) in hot.items():
        cold_ms, cold_body = cold[view]
        assert cold_body == body, f"{view}: the archived answer differs"
        rows[view] = {"hot_ms": hot_ms, "archived_ms": cold_ms, "ratio": cold_ms / hot_ms}
    return {"steps": steps, "reps": reps, "ledger_entries": len(hot["/events"][1]), "views": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run_reads", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    if args.steps < 3 or args.reps < 1:
        parser.error("--steps must be >= 3 and --reps >= 1")
    with EmbeddedServer() as server, tempfile.TemporaryDirectory() as tmp:
        dsn = f"sqlite:///{Path(tmp) / 'history.db'}"
        log(f"run reads: a {args.steps}-step run, {args.reps} reads per view ...")
        result = asyncio.run(scenario(server.url, dsn, args.steps, args.reps))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['steps']} steps, {result['ledger_entries']} ledger entries")
    for view, row in result["views"].items():
        print(
            f"{view:8s} hot {row['hot_ms']:8.1f} ms  archived {row['archived_ms']:8.1f} ms  "
            f"ratio {row['ratio']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
