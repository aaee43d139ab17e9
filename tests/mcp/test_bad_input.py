"""Hostile and broken arguments through MCP: each one a tool error naming the field and
the value, nothing written, the session still usable; and a call while Redis is down is
a clear, retryable error."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.mcp.tools import TOOL_CAPABILITIES
from airuntime.control_plane.settings import ControlPlaneSettings
from tests.mcp.conftest import TINY, WAITING, mcp_session, ok, refused, stack
from tests.mcp.test_access import UNKNOWN

BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    # (tool, arguments, what the error must name)
    ("submit_run", {}, ["give exactly one of pipeline or pipeline_yaml"]),
    ("submit_run", {"pipeline": TINY, "pipeline_yaml": "id: x"}, ["exactly one of"]),
    ("submit_run", {"pipeline_yaml": "- just\n- a list"}, ["'pipeline_yaml'", "mapping"]),
    ("submit_run", {"pipeline_yaml": "id: [unclosed"}, ["'pipeline_yaml'", "not valid YAML"]),
    (
        "submit_run",
        {"pipeline": {"id": "p", "steps": [{"id": "s1", "uses": "nope"}]}},
        ["'pipeline'", "step 's1'", "nope"],
    ),
    ("submit_run", {"pipeline": TINY, "mode": "Sideways"}, ["mode", "'Sideways'"]),
    ("submit_run", {"pipeline": TINY, "project": "secret"}, ["permission denied", "'secret'"]),
    ("submit_run", {"pipeline": TINY, "metadata": {"k": "v" * 2000}}, ["metadata.k", "1024"]),
    ("submit_run", {"pipeline": TINY, "inputs": {"x": "y" * 300_000}}, ["inputs", "bytes"]),
    (
        "submit_run",
        {"pipeline": TINY, "idempotency_key": "has space"},
        ["idempotency_key", "'has space'"],
    ),
    ("get_run", {"shared_run_id": "sr-nope"}, ["shared_run_id", "'sr-nope'"]),
    ("get_run", {}, ["shared_run_id", "required"]),
    ("list_runs", {"status": ["Exploded"]}, ["status.0", "'Exploded'"]),
    ("list_runs", {"limit": 0}, ["limit", "0"]),
    ("list_runs", {"cursor": "forged"}, ["cursor"]),
    ("drain_queue", {"max_count": 0}, ["max_count", "0"]),
    ("drain_queue", {"max_count": "lots"}, ["max_count", "'lots'"]),
    ("set_step_slots", {"limit": -1}, ["limit", "-1"]),
    ("get_tenant_settings", {"tenant_id": "Not A Label"}, ["tenant_id", "'Not A Label'"]),
    (
        "set_tenant_settings",
        {"settings": {"tenant_id": "tenant-a", "isolation_mode": "Sideways"}},
        ["settings.isolation_mode", "'Sideways'"],
    ),
    (
        "set_tenant_settings",
        {"settings": {"tenant_id": "tenant-a", "workers_per_instance": 0}},
        ["settings.workers_per_instance", "0"],
    ),
    ("no_such_tool", {}, ["no_such_tool"]),
]


async def test_bad_arguments_are_tool_errors_naming_field_and_value(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    async with (
        stack(valkey, history, manual) as s,
        mcp_session(s.url, "admin-a") as admin,
    ):
        before = await s.cp.registry.tenant("tenant-a")
        for tool, arguments, names in BAD:
            text = await refused(admin, tool, **arguments)
            for name in names:
                assert name in text, f"{tool}({arguments}) -> {text!r} should name {name!r}"
        # Nothing written by any refused call; the session still works.
        assert await s.cp.runs.list(None, 10) == []
        assert await s.cp.queue.pending_by_tenant() == {}
        assert await s.cp.registry.tenant("tenant-a") == before
        assert (await ok(admin, "queue_status"))["pending"] == 0


async def test_state_refusals_name_the_run_the_step_and_its_state(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    async with (
        stack(valkey, history, manual) as s,
        mcp_session(s.url, "operator-a") as op,
    ):
        queued = (await ok(op, "submit_run", pipeline=WAITING))["shared_run_id"]
        text = await refused(op, "pause_run", shared_run_id=queued)
        assert f"conflict: cannot pause run {queued}: it has no execution yet" in text
        text = await refused(op, "run_report", shared_run_id=queued)
        assert "conflict" in text and "no execution yet (status QueuedGlobally)" in text
        text = await refused(op, "answer_input", shared_run_id=queued, step="approve", value=1)
        assert "conflict: step 'approve': the run has no execution yet" in text
        assert "not found" in await refused(op, "get_run", shared_run_id=UNKNOWN)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("tool", ["queue_status", "list_instances", "submit_run", "get_run"])
async def test_a_call_while_redis_is_down_is_a_retryable_error(history: Any, tool: str) -> None:
    """The control plane's Redis does not answer (nothing listens on its port)."""
    from tests.mcp.conftest import serve_app_only

    dead = Redis.from_url(f"redis://127.0.0.1:{_free_port()}/0", socket_connect_timeout=1)
    args = {"submit_run": {"pipeline": TINY}, "get_run": {"shared_run_id": UNKNOWN}}
    async with serve_app_only(dead, history) as url, mcp_session(url, "operator-a") as op:
        text = await refused(op, tool, **args.get(tool, {}))
        assert "unavailable (retryable): Redis is not available (ConnectionError)" in text
        assert "retry in 5 s" in text
        assert len((await op.list_tools()).tools) == len(TOOL_CAPABILITIES)  # the session lives on
    await dead.aclose()
