"""``airt mcp`` spawned as a real process and driven by the SDK's stdio client: as a
relay to a control plane's ``/mcp`` (AIRUNTIME_API_URL + token), and serving straight
from Redis as a token's principal (or an explicit local admin)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from redis.asyncio import Redis

from airuntime.control_plane.mcp.tools import TOOL_CAPABILITIES
from airuntime.control_plane.settings import ControlPlaneSettings
from tests.mcp.conftest import TINY, mcp_session, ok, refused, stack, token, tokens_yaml, until

AIRT = str(Path(sys.executable).parent / "airt")


@asynccontextmanager
async def spawned(env: dict[str, str], *args: str) -> AsyncIterator[ClientSession]:
    """``airt mcp ARGS`` with ``env`` (and nothing else of this process's AIRUNTIME_*)."""
    params = StdioServerParameters(command=AIRT, args=["mcp", *args], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _airt_mcp(env: dict[str, str]) -> tuple[int, str, str]:
    """``airt mcp`` run to its end without blocking the loop that serves the stack."""
    proc = await asyncio.create_subprocess_exec(
        AIRT, "mcp", env={"PATH": "/usr/bin:/bin", **env}, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _home(tmp_path: Path) -> dict[str, str]:
    return {
        "AIRUNTIME_HOME": str(tmp_path / "home"),
        "AIRUNTIME_HISTORY_DSN": f"sqlite:///{tmp_path / 'stdio-history.db'}",
    }


async def _succeeded(session: ClientSession, srid: str) -> dict[str, Any] | None:
    body = await ok(session, "get_run", shared_run_id=srid)
    return body if body["status"] == "Succeeded" else None


async def test_relay_to_the_control_planes_mcp(
    valkey: Redis, history: Any, manual: ControlPlaneSettings, tmp_path: Path
) -> None:
    async with stack(valkey, history, manual) as s:
        env = {**_home(tmp_path), "AIRUNTIME_API_URL": s.url}
        async with (
            spawned({**env, "AIRUNTIME_API_TOKEN": token("operator-a")}) as op,
            spawned({**env, "AIRUNTIME_API_TOKEN": token("viewer-a")}) as viewer,
            spawned({**env, "AIRUNTIME_API_TOKEN": token("operator-b")}) as other,
        ):
            assert {t.name for t in (await op.list_tools()).tools} == set(TOOL_CAPABILITIES)
            srid = (await ok(op, "submit_run", pipeline=TINY, inputs={"word": "stdio"}))[
                "shared_run_id"
            ]
            assert (await ok(viewer, "get_run", shared_run_id=srid))["status"] == "QueuedGlobally"
            denied = await refused(viewer, "drain_queue", max_count=1)
            assert "needs the 'operator' role" in denied and "user 'viewer-a'" in denied
            assert "not found" in await refused(other, "get_run", shared_run_id=srid)
            assert (await ok(op, "drain_queue", max_count=5))["dispatched"] == 1
            done = await until(lambda: _succeeded(op, srid), what="the run to succeed")
            assert done["steps"]["b"]["output"] == "stdio"
            # The same run, read over HTTP directly: one implementation behind both.
            async with mcp_session(s.url, "operator-a") as http:
                assert await ok(http, "get_run", shared_run_id=srid) == done

        # A wrong token, or no MCP served: exit 2 before any message, saying why.
        for extra, message in (
            ({"AIRUNTIME_API_TOKEN": "wrong-token"}, "401, the token is refused"),
            (
                {"AIRUNTIME_API_TOKEN": token("operator-a"), "AIRUNTIME_API_URL": s.url + "/v1"},
                "404, the control plane serves no MCP",
            ),
        ):
            code, out, err = await _airt_mcp({**env, **extra})
            assert (code, out) == (2, ""), err
            assert message in err


async def test_serving_from_redis_as_a_tokens_principal(
    valkey: Redis, valkey_url: str, history: Any, manual: ControlPlaneSettings, tmp_path: Path
) -> None:
    tokens = tokens_yaml(tmp_path / "tokens.yaml")
    env = {
        **_home(tmp_path),
        "AIRUNTIME_REDIS_URL": valkey_url,
        "AIRUNTIME_TOKENS_FILE": str(tokens),
        "AIRUNTIME_BACKGROUND_PUMP": "false",
    }
    async with (
        stack(valkey, history, manual) as s,
        spawned({**env, "AIRUNTIME_API_TOKEN": token("operator-a")}) as op,
        spawned({**env, "AIRUNTIME_API_TOKEN": token("submitter-a")}) as sub,
        spawned(env, "--local-admin", "--tenant", "tenant-b") as admin_b,
    ):
        srid = (await ok(sub, "submit_run", pipeline=TINY, inputs={"word": "redis"}))[
            "shared_run_id"
        ]
        assert "needs the 'operator' role" in await refused(sub, "drain_queue")
        assert "not found" in await refused(admin_b, "get_run", shared_run_id=srid)
        # The drain runs in the stdio process; the runtime gets the run through Redis,
        # and the control plane on the same Redis ends the shared run.
        assert (await ok(op, "drain_queue", max_count=5))["dispatched"] == 1
        done = await until(lambda: _succeeded(op, srid), what="the run to succeed")
        assert done["assigned_instance_id"] == s.hosts[0].instances[0].instance_id
        assert done["snapshot"]["user_id"] == "submitter-a"
        # The local admin may change settings (of any tenant).
        slots = await ok(admin_b, "set_step_slots", limit=3, tenant_id="tenant-a")
        assert slots["tenant_id"] == "tenant-a" and slots["max_concurrent_step_tasks"] == 3


def test_redis_mode_without_a_principal_exits_2(valkey_url: str, tmp_path: Path) -> None:
    base = {**_home(tmp_path), "PATH": "/usr/bin:/bin", "AIRUNTIME_REDIS_URL": valkey_url}
    cases = [
        ({}, "needs --token with --tokens-file"),
        (
            {
                "AIRUNTIME_TOKENS_FILE": str(tokens_yaml(tmp_path / "t.yaml")),
                "AIRUNTIME_API_TOKEN": "nobodys-token",
            },
            "--token: not a token of",
        ),
    ]
    for extra, message in cases:
        done = subprocess.run(
            [AIRT, "mcp"], env={**base, **extra}, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
        assert done.stdout == ""  # nothing on the protocol channel
