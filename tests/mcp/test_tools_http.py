"""The MCP server over streamable HTTP with the SDK's own client: the tool list and its
schemas, every tool's happy path, resources and prompts, on a real control plane with a
real runtime on real Valkey."""

from __future__ import annotations

import json
from typing import Any

import httpx
from mcp.types import TextResourceContents

from airuntime.control_plane.mcp.access import role_for
from airuntime.control_plane.mcp.tools import TOOL_CAPABILITIES
from airuntime.control_plane.rbac import Capability
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.engine.ledger_batches import per_step
from runtime_pod.config import InstanceConfig
from tests.mcp.conftest import TINY, WAITING, mcp_session, ok, refused, stack, until


async def test_tools_resources_and_prompts_are_listed_with_schemas_and_roles(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    async with stack(valkey, history, manual) as s, mcp_session(s.url, "viewer-a") as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == set(TOOL_CAPABILITIES)
        for name, tool in tools.items():
            capability = TOOL_CAPABILITIES[name]
            assert tool.input_schema["type"] == "object", name
            assert tool.output_schema is not None and tool.output_schema["type"] == "object"
            assert f"Needs the {role_for(capability)} role." in (tool.description or "")
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is (capability is Capability.READ)
        submit = tools["submit_run"].input_schema["properties"]
        assert {"pipeline", "pipeline_yaml", "inputs", "mode", "project"} <= set(submit)
        assert tools["get_run"].input_schema["required"] == ["shared_run_id"]
        drain = tools["drain_queue"].input_schema["properties"]["max_count"]
        assert (drain["minimum"], drain["maximum"]) == (1, 100_000)  # DrainRequest's bounds
        row = tools["list_instances"].output_schema["$defs"]["InstanceRow"]["properties"]
        seed_columns = {
            "instance_id", "role", "status", "worker_count", "active_worker_count",
            "available_worker_count", "max_local_workers_per_execution", "queued_run_count",
            "running_run_count", "active_run_count", "available_run_slots", "is_queue_paused",
            "can_accept_run", "last_heartbeat_at_ms", "tenant_id", "tenant_group_id",
            "isolation_mode", "prefer_dedicated", "allow_shared_fallback", "provider_name",
            "provider_endpoint",
        }  # fmt: skip
        assert seed_columns <= set(row)
        templates = (await session.list_resource_templates()).resource_templates
        assert {t.uri_template for t in templates} == {
            "airuntime://runs/{shared_run_id}",
            "airuntime://runs/{shared_run_id}/ledger",
            "airuntime://tenants/{tenant_id}/instances",
        }
        prompts = {p.name for p in (await session.list_prompts()).prompts}
        assert prompts == {"why_is_my_run_waiting", "drain_tenant_safely"}


async def test_mcp_refuses_a_request_without_a_known_bearer_token(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with stack(valkey, history, manual) as s, httpx.AsyncClient() as http:
        for headers in ({}, {"authorization": "Bearer not-a-token"}):
            resp = await http.post(f"{s.url}/mcp", json=body, headers=headers)
            assert resp.status_code == 401
            assert resp.headers["www-authenticate"] == "Bearer"
            assert "bearer token" in resp.json()["detail"]


async def test_steering_reading_and_replaying_a_run_through_mcp(valkey: Any, history: Any) -> None:
    settings = ControlPlaneSettings(scale_out_enabled=False)  # the background pump runs
    async with stack(valkey, history, settings) as s, mcp_session(s.url, "operator-a") as op:
        run = await ok(op, "submit_run", pipeline=WAITING)
        srid = run["shared_run_id"]

        async def waiting() -> dict[str, Any] | None:
            body = await ok(op, "get_run", shared_run_id=srid)
            execution = body.get("execution") or {}
            return body if execution.get("status") == "WaitingForInput" else None

        await until(waiting, what="the input step to wait")
        paused = await ok(op, "pause_run", shared_run_id=srid)
        assert paused["status"] in ("Pausing", "Paused")
        resumed = await ok(op, "resume_run", shared_run_id=srid)
        assert resumed["execution_id"] == paused["execution_id"]
        await until(waiting, what="the input step to wait again after resume")
        answered = await ok(op, "answer_input", shared_run_id=srid, step="approve", value="yes")
        assert answered["execution_id"] == paused["execution_id"]
        done = await until(lambda: _ended(op, srid), what="the run to end")
        assert done["status"] == "Succeeded"
        assert done["steps"]["after"]["output"] == "yes"

        report = await ok(op, "run_report", shared_run_id=srid)
        assert report["execution_id"] == paused["execution_id"]
        assert report["status"] == "Succeeded"
        assert set(report["critical_path"]["steps"]) == {"approve", "after"}
        trace = await ok(op, "run_trace", shared_run_id=srid)
        assert [st["step"] for st in trace["steps"]] == ["approve", "after"]
        ledger = await _whole_ledger(op, srid)
        types = [e["type"] for e in ledger]
        # the answer completes the input step; the other step completes once
        completed = [
            f["step"]
            for e in ledger
            for kind, f in per_step(e["type"], e["fields"])
            if kind == "step_completed"
        ]
        assert types.count("input_provided") == 1 and completed == ["after"]
        paused_at, resumed_at = types.index("execution_paused"), types.index("execution_resumed")
        assert paused_at < resumed_at < types.index("input_provided")

        replay = await ok(op, "replay_run", shared_run_id=srid)
        assert replay["replay_of"] == srid and replay["shared_run_id"] != srid
        listed = await ok(op, "list_runs")
        ids = [r["shared_run_id"] for r in listed["runs"]]
        assert ids[:2] == [replay["shared_run_id"], srid]  # newest first
        # Cancel the replay once it waits for its input, a stable state: a cancel racing
        # the pump's delivery of the run only records "cancel requested" (ControlPlane.cancel).
        again = replay["shared_run_id"]

        async def replay_waiting() -> bool:
            body = await ok(op, "get_run", shared_run_id=again)
            return (body.get("execution") or {}).get("status") == "WaitingForInput"

        await until(replay_waiting, what="the replay to wait for its input")
        cancelled = await ok(op, "cancel_run", shared_run_id=again)
        assert cancelled["shared_run_id"] == replay["shared_run_id"]
        await until(lambda: _ended(op, replay["shared_run_id"]), what="the replay to be cancelled")
        ended = await ok(op, "get_run", shared_run_id=replay["shared_run_id"])
        assert ended["status"] == "Cancelled"


async def _ended(session: Any, srid: str) -> dict[str, Any] | None:
    body = await ok(session, "get_run", shared_run_id=srid)
    return body if body["status"] in ("Succeeded", "Failed", "Cancelled") else None


async def _whole_ledger(session: Any, srid: str) -> list[dict[str, Any]]:
    """Every ledger entry, two at a time through the cursor (the pages must chain)."""
    entries: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await ok(session, "run_ledger", shared_run_id=srid, cursor=cursor, limit=2)
        entries += page["events"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [e["seq"] for e in entries] == list(range(len(entries)))
    return entries


async def test_queue_fleet_and_tenant_settings_tools(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    dedicated = InstanceConfig(
        workers=3, heartbeat_s=0.5, tenant_id="tenant-a", isolation_mode="Dedicated",
        runtime_prefix="tenant-a-runtime", instance_id="tenant-a-runtime-1",
    )  # fmt: skip
    shared = InstanceConfig(workers=2, heartbeat_s=0.5, instance_id="shared-1")
    async with (
        stack(valkey, history, manual, runtimes=[dedicated, shared]) as s,
        mcp_session(s.url, "admin-a") as admin,
        mcp_session(s.url, "operator-b") as b,
    ):
        # tenant-a (Shared by default) sees the shared instance and its own; flat rows.
        table = await ok(admin, "list_instances")
        assert table["tenant_id"] == "tenant-a"
        by_id = {r["instance_id"]: r for r in table["instances"]}
        assert set(by_id) == {"shared-1", "tenant-a-runtime-1"}
        assert [r["instance_id"] for r in (await ok(b, "list_instances"))["instances"]] == [
            "shared-1"
        ]  # tenant-b never sees tenant-a's dedicated runtime
        row = by_id["shared-1"]
        assert (row["worker_count"], row["isolation_mode"]) == (2, "Shared")
        assert row["can_accept_run"] is True and row["provider_name"] == "redis"

        # An admin makes tenant-a Dedicated (no fallback): only its own runtime is left.
        current = await ok(admin, "get_tenant_settings")
        assert current["tenant_id"] == "tenant-a" and current["isolation_mode"] == "Shared"
        new = {
            **current,
            "isolation_mode": "Dedicated",
            "allow_shared_fallback": False,
            "runtime_prefix": "tenant-a-runtime",
        }
        stored = await ok(admin, "set_tenant_settings", settings=new)
        assert stored["isolation_mode"] == "Dedicated"
        assert stored["allow_shared_fallback"] is False
        rows = (await ok(admin, "list_instances"))["instances"]
        assert [r["instance_id"] for r in rows] == ["tenant-a-runtime-1"]
        assert rows[0]["tenant_id"] == "tenant-a" and rows[0]["worker_count"] == 3

        # Step slots: applied live by the runtime tenant-a owns.
        slots = await ok(admin, "set_step_slots", limit=2)
        assert slots["max_concurrent_step_tasks"] == 2
        owned = next(h for h in s.hosts if h.instances[0].config.tenant_id == "tenant-a")
        await until(lambda: _async(owned.instances[0].slots.limit == 2), what="the live slot limit")

        # Queue status is per tenant; an admin sees every tenant.
        await ok(admin, "submit_run", pipeline=TINY, inputs={"word": "a"})
        await ok(b, "submit_run", pipeline=TINY, inputs={"word": "b"})
        assert (await ok(b, "queue_status"))["pending_by_tenant"] == {"tenant-b": 1}
        everyone = await ok(admin, "queue_status")
        assert everyone == {"pending": 2, "pending_by_tenant": {"tenant-a": 1, "tenant-b": 1}}

        # Resources and a prompt read the same things.
        [content] = (await admin.read_resource("airuntime://tenants/tenant-a/instances")).contents
        assert isinstance(content, TextResourceContents)
        assert '"instance_id":"tenant-a-runtime-1"' in content.text
        prompt = await admin.get_prompt("drain_tenant_safely", {"tenant_id": "tenant-a"})
        text = prompt.messages[0].content.text  # type: ignore[union-attr]
        assert "stop_on_failure=true" in text and "tenant-a-runtime-1" in text


async def _async(value: bool) -> bool:
    return value


async def test_list_model_providers_shows_what_the_tenant_may_call(
    valkey: Any, history: Any, manual: ControlPlaneSettings, monkeypatch: Any
) -> None:
    """An agent writing a pipeline asks which providers its `model` steps may name: the
    platform's, narrowed by the tenant's allowed_model_providers; names, never URLs."""
    providers = {
        "openai": {"base_url": "https://api.openai.com/v1", "models": ["gpt-4o-mini"]},
        "local": {"base_url": "http://10.0.0.7:8000/v1", "max_output_tokens": 512},
    }
    monkeypatch.setenv("AIRUNTIME_MODEL_PROVIDERS", json.dumps(providers))
    async with stack(valkey, history, manual) as s, mcp_session(s.url, "admin-a") as admin:
        table = await ok(admin, "list_model_providers")
        assert table == {
            "tenant_id": "tenant-a",
            "providers": [
                {"name": "local", "api": "openai", "models": [], "max_output_tokens": 512},
                {"name": "openai", "api": "openai", "models": ["gpt-4o-mini"],
                 "max_output_tokens": 4096},
            ],
        }  # fmt: skip
        current = await ok(admin, "get_tenant_settings")
        await ok(
            admin, "set_tenant_settings", settings={**current, "allowed_model_providers": ["local"]}
        )
        narrowed = await ok(admin, "list_model_providers")
        assert [p["name"] for p in narrowed["providers"]] == ["local"]
        no_model = [h for h in current["allowed_handlers"] if h != "model"]
        await ok(admin, "set_tenant_settings", settings={**current, "allowed_handlers": no_model})
        assert (await ok(admin, "list_model_providers"))["providers"] == []


async def test_list_secrets_shows_names_never_values(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    """An agent writing a pipeline asks which secrets its http steps may name: names,
    who set each and when; never a value (setting one is not a tool)."""
    value = "mcp-listed-secret-value-0123456789"
    async with stack(valkey, history, manual) as s, mcp_session(s.url, "viewer-a") as viewer:
        assert await ok(viewer, "list_secrets") == {"tenant_id": "tenant-a", "secrets": []}
        await s.cp.secrets.put("tenant-a", "API_TOKEN", value, "alice")
        table = await ok(viewer, "list_secrets")
        assert [(x["name"], x["updated_by"]) for x in table["secrets"]] == [("API_TOKEN", "alice")]
        assert value not in json.dumps(table)
        tools = {t.name for t in (await viewer.list_tools()).tools}
        assert not {t for t in tools if "secret" in t} - {"list_secrets"}, "no tool sets one"


async def test_model_usage_shows_the_budget_and_where_the_tenant_stands(
    valkey: Any, history: Any, manual: ControlPlaneSettings
) -> None:
    """An agent planning model steps asks how many tokens its tenant has left: none set
    is "not limited" (null); once set, the window's use, what calls hold, what is left."""
    from airuntime.engine.model_budget import ModelBudgets, ModelTokenBudget
    from airuntime.fleet.registry import Registry
    from airuntime.fleet.tenancy import TenantSettings

    async with stack(valkey, history, manual) as s, mcp_session(s.url, "viewer-a") as viewer:
        unlimited = await ok(viewer, "model_usage")
        assert unlimited["tenant_id"] == "tenant-a" and unlimited["budget"] is None
        await Registry(valkey).put_tenant(
            TenantSettings(tenant_id="tenant-a", model_token_budget=ModelTokenBudget(tokens=900))
        )
        held = await ModelBudgets(valkey).reserve("tenant-a", 400)
        assert held is not None
        usage = await ok(viewer, "model_usage")
        assert (usage["budget"], usage["window"], usage["used"], usage["reserved"]) == (
            900, "day", 0, 400
        )  # fmt: skip
        assert usage["remaining"] == 500
        assert "not found" in await refused(viewer, "model_usage", tenant_id="tenant-b")
