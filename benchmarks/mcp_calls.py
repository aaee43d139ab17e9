"""MCP vs the HTTP API: what the second front door costs for the same operation.

Run ``python -m benchmarks.mcp_calls [--json] [--reps R]`` from the repository root. A
private embedded Valkey, one runtime host and one control plane run in-process; the
control plane's app is served by uvicorn on a local port (as ``airt control-plane``).

Set-up: one run of a 4-step pipeline is submitted and waited for. Then the same reads
are made ``R`` times each through both doors, alternating so load changes hit both
alike: ``get_run`` (``GET /v1/runs/{id}``), ``queue_status`` (``GET /v1/queue``) and
``list_instances`` (``GET /v1/instances``) -- the HTTP calls with httpx, the MCP calls
with the official SDK's client over streamable HTTP, one initialized session reused.

Printed per operation: the median milliseconds through each door and the ratio MCP /
HTTP (both call the same function in ``api/operations.py``; the difference is the
protocol: JSON-RPC framing, the SDK's validation of arguments and structured output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from redis.asyncio import Redis

from airuntime.control_plane.api import close_app, create_app
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.history import open_history_store
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost

TOKEN = "token-bench"
HEADERS = {"authorization": f"Bearer {TOKEN}"}
PIPELINE = {
    "id": "bench",
    "steps": [{"id": f"s{i}", "uses": "noop", **({"depends_on": [f"s{i - 1}"]} if i else {})}
              for i in range(4)],
}  # fmt: skip


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _median_ms(call: Callable[[], Awaitable[Any]], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def _serve(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 -- uvicorn exposes a flag, not an event
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


async def _measure(url: str, srid: str, reps: int) -> dict[str, Any]:
    ops = {
        "get_run": (f"/v1/runs/{srid}", {"shared_run_id": srid}),
        "queue_status": ("/v1/queue", {}),
        "list_instances": ("/v1/instances", {}),
    }
    http2 = httpx2.AsyncClient(headers=HEADERS, timeout=60)
    async with (
        httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as http,
        http2,
        streamable_http_client(f"{url}/mcp", http_client=http2) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result: dict[str, Any] = {}
        for tool, (path, args) in ops.items():
            api: list[float] = []
            mcp: list[float] = []
            for _ in range(reps // 10):  # alternate in rounds of 10
                api += await _median_ms(lambda p=path: http.get(p), 10)  # type: ignore[misc]
                mcp += await _median_ms(lambda t=tool, a=args: session.call_tool(t, a), 10)  # type: ignore[misc]
            a, m = statistics.median(api), statistics.median(mcp)
            result[tool] = {"http_ms": round(a, 2), "mcp_ms": round(m, 2), "ratio": round(m / a, 2)}
            log(f"{tool}: HTTP {a:.2f} ms, MCP {m:.2f} ms, ratio {m / a:.2f}")
        return result


async def run(redis_url: str, history_dsn: str, reps: int) -> dict[str, Any]:
    redis = Redis.from_url(redis_url)
    history = await open_history_store(history_dsn)
    host = RuntimeHost(redis, InstanceConfig(workers=4, heartbeat_s=0.5), instances=1)
    await host.start()
    cp = ControlPlane(redis, ControlPlaneSettings(scale_out_enabled=False))
    await cp.start()
    auth = Authenticator([TokenEntry(token=TOKEN, user="bench", tenant="default", roles=["admin"])])
    app = create_app(cp, auth, history=history)
    server, task, url = await _serve(app)
    try:
        async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as http:
            submitted = await http.post("/v1/runs", json={"pipeline": PIPELINE})
            srid = submitted.json()["shared_run_id"]
            # The run ends in another component: the API is polled, as a client does.
            while (await http.get(f"/v1/runs/{srid}")).json()["status"] != "Succeeded":  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        return {"reps": reps, "operations": await _measure(url, srid, reps)}
    finally:
        server.should_exit = True
        await task
        await close_app(app)
        await cp.stop()
        await host.stop(drain_timeout_s=5)
        await history.close()
        await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--reps", type=int, default=200, help="calls per operation and door")
    args = parser.parse_args(argv)
    with EmbeddedServer() as server, tempfile.TemporaryDirectory() as tmp:
        dsn = f"sqlite:///{Path(tmp) / 'history.db'}"
        result = asyncio.run(run(server.url, dsn, max(10, args.reps)))
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
