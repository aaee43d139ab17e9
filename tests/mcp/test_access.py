"""RBAC and the tenant boundary through MCP: every tool refused to every role that lacks
its capability (the error names the role), another tenant's runs and settings are "not
found" exactly like missing ones, and a drain by another tenant's operator still sends
a run only where the run's own (stored) tenant may go."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airuntime.control_plane.mcp.access import role_for
from airuntime.control_plane.mcp.tools import TOOL_CAPABILITIES
from airuntime.control_plane.rbac import ROLES
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.fleet.tenancy import IsolationMode
from runtime_pod.config import InstanceConfig
from tests.mcp.conftest import TINY, TOKENS, mcp_session, ok, refused, stack, until

UNKNOWN = "sr-" + "0" * 32

ARGUMENTS: dict[str, dict[str, Any]] = {
    "submit_run": {"pipeline": TINY},
    "get_run": {"shared_run_id": UNKNOWN},
    "list_runs": {},
    "cancel_run": {"shared_run_id": UNKNOWN},
    "answer_input": {"shared_run_id": UNKNOWN, "step": "approve", "value": 1},
    "pause_run": {"shared_run_id": UNKNOWN},
    "resume_run": {"shared_run_id": UNKNOWN},
    "replay_run": {"shared_run_id": UNKNOWN},
    "run_report": {"shared_run_id": UNKNOWN},
    "run_ledger": {"shared_run_id": UNKNOWN},
    "run_trace": {"shared_run_id": UNKNOWN},
    "drain_queue": {"max_count": 1},
    "queue_status": {},
    "list_instances": {},
    "list_model_providers": {},
    "list_secrets": {},
    "model_usage": {},
    "get_tenant_settings": {},
    "set_tenant_settings": {"settings": {"tenant_id": "tenant-a"}},
    "set_step_slots": {"limit": 1},
}
"""Well-formed arguments for each tool (the RBAC check comes before anything runs)."""


def test_every_tool_has_arguments_here() -> None:
    assert set(ARGUMENTS) == set(TOOL_CAPABILITIES)


async def test_each_role_is_refused_every_tool_it_may_not_use(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    denials = 0
    async with stack(valkey, history, manual) as s:
        for role in ("viewer", "submitter", "operator"):
            async with mcp_session(s.url, f"{role}-a") as session:
                for tool, capability in TOOL_CAPABILITIES.items():
                    if capability in ROLES[role]:
                        continue
                    text = await refused(session, tool, **ARGUMENTS[tool])
                    assert f"permission denied: {tool} needs the {role_for(capability)!r} role" in (
                        text
                    )
                    assert f"user '{role}-a'" in text
                    denials += 1
                await ok(session, "queue_status")  # the session survived every refusal
        # Nothing a refused call could have written was written.
        assert await s.cp.queue.pending_by_tenant() == {}
        assert await s.cp.runs.list(None, 10) == []
    assert denials == 9 + 6 + 1  # viewer, submitter, operator (admin is refused nothing)


async def test_submit_run_with_an_idempotency_key_called_again_is_the_same_run(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    """An agent whose call's answer was lost calls again: one run. The key is the
    tenant's own; the same key with other inputs is refused naming the run."""
    async with (
        stack(valkey, history, manual) as s,
        mcp_session(s.url, "operator-a") as a,
        mcp_session(s.url, "operator-b") as b,
    ):
        args = {"pipeline": TINY, "inputs": {"word": "x"}, "idempotency_key": "agent-call-1"}
        first = await ok(a, "submit_run", **args)
        again = await ok(a, "submit_run", **args)
        assert again["shared_run_id"] == first["shared_run_id"]
        assert (first["replayed"], again["replayed"]) == (False, True)
        theirs = await ok(b, "submit_run", **args)
        assert theirs["shared_run_id"] != first["shared_run_id"] and not theirs["replayed"]
        other = await refused(a, "submit_run", **{**args, "inputs": {"word": "y"}})
        assert "was used for another request" in other and first["shared_run_id"] in other
        assert len((await ok(a, "list_runs"))["runs"]) == 1


async def test_another_tenants_run_is_not_found_like_a_missing_one(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    async with (
        stack(valkey, history, manual) as s,
        mcp_session(s.url, "operator-a") as a,
        mcp_session(s.url, "operator-b") as b,
    ):
        srid = (await ok(a, "submit_run", pipeline=TINY, inputs={"word": "x"}))["shared_run_id"]
        for tool in ("get_run", "cancel_run", "pause_run", "resume_run", "replay_run",
                     "run_report", "run_ledger", "run_trace", "answer_input"):  # fmt: skip
            args = {**ARGUMENTS[tool], "shared_run_id": srid}
            theirs = await refused(b, tool, **args)
            missing = await refused(b, tool, **{**args, "shared_run_id": UNKNOWN})
            assert theirs == missing.replace(UNKNOWN, srid), tool
            assert f"not found: shared run '{srid}' not found" in theirs
        assert (await ok(b, "list_runs"))["runs"] == []
        assert (await ok(b, "queue_status"))["pending_by_tenant"] == {}
        for tool, args in (("get_tenant_settings", {"tenant_id": "tenant-a"}),
                           ("set_step_slots", {"tenant_id": "tenant-a", "limit": 0})):  # fmt: skip
            assert "not found: tenant 'tenant-a' not found" in await refused(b, tool, **args)
        for uri in (f"airuntime://runs/{srid}", f"airuntime://runs/{srid}/ledger",
                    "airuntime://tenants/tenant-a/instances"):  # fmt: skip
            with pytest.raises(Exception, match="not found"):
                await b.read_resource(uri)
        # tenant-a's run is untouched: still queued, not cancelled by b's attempt.
        mine = await ok(a, "get_run", shared_run_id=srid)
        assert mine["status"] == "QueuedGlobally"
        assert (await ok(a, "queue_status"))["pending_by_tenant"] == {"tenant-a": 1}


async def test_a_drain_by_another_tenant_dispatches_by_the_runs_stored_snapshot(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    """tenant-b's operator drains; tenant-a's queued runs go only to tenant-a's dedicated
    runtime, never to tenant-b's, whoever called the tool."""
    a_rt = InstanceConfig(
        workers=4, max_local_workers_per_execution=1, max_concurrent_runs=4, heartbeat_s=0.5,
        tenant_id="tenant-a", isolation_mode=IsolationMode.DEDICATED,
        runtime_prefix="tenant-a-runtime", instance_id="tenant-a-runtime-1",
        allow_shared_fallback=False,
    )  # fmt: skip
    b_rt = a_rt.model_copy(
        update={
            "tenant_id": "tenant-b",
            "instance_id": "tenant-b-runtime-1",
            "runtime_prefix": "tenant-b-runtime",
        }
    )
    async with (
        stack(valkey, history, manual, runtimes=[a_rt, b_rt]) as s,
        mcp_session(s.url, "operator-a") as a,
        mcp_session(s.url, "admin-a") as admin,
        mcp_session(s.url, "operator-b") as b,
    ):
        dedicated = {"isolation_mode": "Dedicated", "allow_shared_fallback": False}
        for tenant in ("tenant-a", "tenant-b"):
            settings = {"tenant_id": tenant, "runtime_prefix": f"{tenant}-runtime", **dedicated}
            await ok(admin, "set_tenant_settings", settings=settings)
        submitted = await asyncio.gather(
            *(ok(a, "submit_run", pipeline=TINY, inputs={"word": str(i)}) for i in range(4))
        )
        dispatched = 0

        async def drained() -> bool:  # a drain dispatches what capacity allows right now
            nonlocal dispatched
            dispatched += (await ok(b, "drain_queue", max_count=10))["dispatched"]
            return dispatched == 4

        await until(drained, what="every run dispatched")
        assert (await ok(a, "queue_status"))["pending"] == 0
        for run in submitted:
            srid = run["shared_run_id"]

            async def ended(srid: str = srid) -> dict[str, Any] | None:
                body = await ok(a, "get_run", shared_run_id=srid)
                return body if body["status"] == "Succeeded" else None

            body = await until(ended, what=f"{srid} to succeed")
            assert body["assigned_instance_id"] == "tenant-a-runtime-1"
            assert body["snapshot"]["tenant_id"] == "tenant-a"
            assert body["snapshot"]["user_id"] == "operator-a"


def test_tokens_cover_every_role() -> None:
    assert {r for _, roles in TOKENS.values() for r in roles} == set(ROLES)
