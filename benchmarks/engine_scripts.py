"""Redis CPU a step of the engine's scripts alone, and paired A/B between script versions.

Run ``python -m benchmarks.engine_scripts [--shape fanout-20000] [--pairs 5]
[--redis-url URL] [--compare DIR]`` from the repository root.

Why this exists: ``dag_throughput`` measures the engine end to end with worker
processes, so its Redis CPU a step moves with everything else the box does. This one
keeps only the server's side: one client drains a DAG through the engine's own
``claimSteps`` / ``completeSteps`` (completions of up to 64 steps, each call claiming
the next 64, no handler), and ``INFO commandstats`` (reset before each drain) gives
the microseconds EVALSHA took a step and how much of that the commands the scripts
ran took (the rest is the Lua side: argument and reply conversion, tables, strings,
Lua's collector). With ``--compare DIR`` (another checkout's ``airuntime/lua``) the
two script versions drain the same DAG alternately on the same server and the paired
ratios (this checkout / DIR) are printed: the way script changes are measured
(``docs/benchmark-history.md``).

Without ``--redis-url`` an embedded Valkey is started. Output: one JSON line per drain
(``scripts``, ``shape``, ``evalsha_us_per_step``, ``commands_us_per_step``,
``server_cpu_us_per_step``), then with ``--compare`` a ``paired`` line (ratios sorted
and their median).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import redis as sync_redis

from airuntime.core.redis_client import connect
from airuntime.core.scripts import LUA_DIR, ScriptLibrary
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.engine.execution_store import ExecutionStore
from benchmarks.dag_shapes import deps_of, plan_of

BATCH = 64
LEASE_MS = 60_000


async def drain(url: str, shape: str, lua_dir: Path) -> dict[str, Any]:
    """Create ``shape``, drain it with one client, return the server's cost a step."""
    plan = plan_of(deps_of(shape), shape)
    steps = len(plan.steps)
    client = connect(url)
    admin = sync_redis.Redis.from_url(url)
    try:
        store = ExecutionStore(client, ScriptLibrary(lua_dir))
        eid = await store.create(plan)
        admin.config_resetstat()
        cpu_before = admin.info("cpu")
        held = [(c.step_id, c.token) for c in (await store.claim(eid, "b", BATCH, LEASE_MS)).claims]
        while held:
            items = [(step, token, "b/w", "null") for step, token in held[:BATCH]]
            result = await store.complete(eid, "b", items, claim_next=BATCH, lease_ms=LEASE_MS)
            held = held[BATCH:] + [(c.step_id, c.token) for c in result.claims]
            if not held and not result.status.terminal:
                claimed = await store.claim(eid, "b", BATCH, LEASE_MS)
                held = [(c.step_id, c.token) for c in claimed.claims]
        cpu_after = admin.info("cpu")
        stats = admin.info("commandstats")
        status = (await store.info(eid)).status
        if status.value != "Succeeded":
            raise RuntimeError(f"{shape}: the drain ended {status}")
        await client.delete(*store.keys_of(eid).all())
    finally:
        await client.aclose()
        admin.close()
    evalsha = stats["cmdstat_evalsha"]["usec"]
    commands = sum(
        v["usec"] for k, v in stats.items() if k.startswith("cmdstat_") and k != "cmdstat_evalsha"
    )
    cpu = sum(cpu_after[k] - cpu_before[k] for k in ("used_cpu_user", "used_cpu_sys"))
    return {
        "scripts": str(lua_dir),
        "shape": shape,
        "evalsha_us_per_step": round(evalsha / steps, 2),
        "commands_us_per_step": round(commands / steps, 2),
        "server_cpu_us_per_step": round(cpu * 1e6 / steps, 2),
    }


async def run(url: str, shape: str, pairs: int, compare: Path | None) -> None:
    dirs = [LUA_DIR] if compare is None else [compare, LUA_DIR]
    figures: dict[Path, list[float]] = {d: [] for d in dirs}
    for _ in range(pairs):
        for d in dirs:
            row = await drain(url, shape, d)
            figures[d].append(row["evalsha_us_per_step"])
            print(json.dumps(row), flush=True)
    if compare is not None:
        ratios = sorted(b / a for a, b in zip(figures[compare], figures[LUA_DIR], strict=True))
        print(
            json.dumps(
                {
                    "paired": f"{LUA_DIR} / {compare}",
                    "shape": shape,
                    "ratios": [round(r, 3) for r in ratios],
                    "median": round(statistics.median(ratios), 3),
                }
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="fanout-20000", help="fanout-<n>, chain-<n>, ...")
    parser.add_argument("--pairs", type=int, default=5, help="drains (pairs with --compare)")
    parser.add_argument("--redis-url", help="use this Redis/Valkey (default: an embedded one)")
    parser.add_argument("--compare", type=Path, help="another checkout's airuntime/lua")
    args = parser.parse_args()
    if args.compare is not None and not (args.compare / "includes").is_dir():
        parser.error(f"--compare {args.compare}: not a scripts directory (no includes/)")
    if args.redis_url:
        asyncio.run(run(args.redis_url, args.shape, args.pairs, args.compare))
        return
    with EmbeddedServer() as server:
        asyncio.run(run(server.url, args.shape, args.pairs, args.compare))


if __name__ == "__main__":
    main()
