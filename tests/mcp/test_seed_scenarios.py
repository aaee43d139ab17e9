"""The reference's MCP scenarios, driven only through MCP tools: a queue-first submit
with the background pump off, inspected, then drained by hand onto the right
instance; local scale-out end to end (no runtime -> scale-out -> requeue ->
completion); report, ledger, trace and replay of a completed run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from mcp.types import TextResourceContents
from redis.asyncio import Redis

from airuntime.control_plane.scale_out import LocalScaler
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.engine.ledger_batches import per_step
from tests.mcp.conftest import TINY, mcp_session, ok, stack, until


async def _succeeded(session: Any, srid: str) -> dict[str, Any] | None:
    body = await ok(session, "get_run", shared_run_id=srid)
    assert body["status"] not in ("Failed", "Cancelled", "Rejected"), body
    return body if body["status"] == "Succeeded" else None


async def test_queue_first_with_the_pump_off_inspect_then_drain_by_hand(
    valkey: Redis, history: Any, manual: ControlPlaneSettings
) -> None:
    async with stack(valkey, history, manual) as s, mcp_session(s.url, "operator-a") as op:
        run = await ok(op, "submit_run", pipeline=TINY, inputs={"word": "hello"}, mode="QueueFirst")
        srid = run["shared_run_id"]
        assert run["status"] == "QueuedGlobally" and run["run_id"] is None

        # Inspect: queued globally, a Pending queue item, no RunId / ExecutionId yet.
        body = await ok(op, "get_run", shared_run_id=srid)
        assert body["status"] == "QueuedGlobally"
        assert body.get("run_id") is None and body.get("execution_id") is None
        assert (await ok(op, "queue_status"))["pending_by_tenant"] == {"tenant-a": 1}
        [instance] = (await ok(op, "list_instances"))["instances"]
        assert instance["can_accept_run"] is True and instance["running_run_count"] == 0
        waiting = await op.get_prompt("why_is_my_run_waiting", {"shared_run_id": srid})
        assert "QueuedGlobally" in waiting.messages[0].content.text  # type: ignore[union-attr]

        # Nothing moves without a drain (the pump is off): it is still queued after the
        # runtime heartbeated and the control plane's loops ran.
        await s.cp.wait_started()
        assert (await ok(op, "get_run", shared_run_id=srid))["status"] == "QueuedGlobally"

        drained = await ok(op, "drain_queue", max_count=1, stop_on_failure=True)
        assert (drained["dispatched"], drained["failed"]) == (1, 0)
        done = await until(lambda: _succeeded(op, srid), what="the drained run to succeed")
        assert done["assigned_instance_id"] == instance["instance_id"]
        assert done["run"]["instance_id"] == instance["instance_id"]
        assert done["pump_worker_id"] == s.cp.identity.worker_id
        assert done["steps"]["b"]["output"] == "hello"
        assert (await ok(op, "queue_status"))["pending"] == 0


@pytest_asyncio.fixture
async def scaler(valkey: Redis, valkey_url: str) -> AsyncIterator[LocalScaler]:
    scaler = LocalScaler(valkey, valkey_url, ready_timeout_s=60, heartbeat_s=0.5)
    try:
        yield scaler
    finally:
        await scaler.close()


async def test_local_scale_out_end_to_end_through_mcp_tools(
    valkey: Redis, history: Any, scaler: LocalScaler
) -> None:
    """No runtime at all; the background pump is off, so every dispatch is a drain."""
    settings = ControlPlaneSettings(background_pump=False, scale_out_enabled=True)
    async with (
        stack(valkey, history, settings, runtimes=[], scale_out_provider=scaler) as s,
        mcp_session(s.url, "operator-default") as op,
    ):
        assert (await ok(op, "list_instances"))["instances"] == []
        srid = (await ok(op, "submit_run", pipeline=TINY, inputs={"word": "scaled"}))[
            "shared_run_id"
        ]
        first = await ok(op, "drain_queue", max_count=1)
        assert first["dispatched"] == 0  # admission asked for scale-out instead
        asked = await ok(op, "get_run", shared_run_id=srid)
        assert asked["status"] == "ScaleOutRequested" and asked["scale_out_request_id"]

        async def requeued() -> bool:  # the scaler started a runtime; the run is queued again
            rows = (await ok(op, "list_instances"))["instances"]
            body = await ok(op, "get_run", shared_run_id=srid)
            return bool(rows) and body["status"] == "QueuedGlobally"

        await until(requeued, timeout_s=90, what="scale-out fulfilled and the run requeued")
        [row] = (await ok(op, "list_instances"))["instances"]
        assert row["instance_id"] == "runtime-instance-1" and row["provider_name"] == "redis"

        async def dispatched() -> bool:
            return (await ok(op, "drain_queue", max_count=1))["dispatched"] == 1

        await until(dispatched, what="the requeued run dispatched by a drain")
        done = await until(lambda: _succeeded(op, srid), timeout_s=90, what="completion")
        assert done["assigned_instance_id"] == "runtime-instance-1"
        assert done["steps"]["b"]["output"] == "scaled"
        assert scaler.started_for("runtime-instance") == ["runtime-instance-1"]


async def test_report_ledger_trace_and_replay_of_a_completed_run(
    valkey: Redis, history: Any
) -> None:
    settings = ControlPlaneSettings(scale_out_enabled=False)  # background pump on
    async with stack(valkey, history, settings) as s, mcp_session(s.url, "operator-a") as op:
        srid = (await ok(op, "submit_run", pipeline=TINY, inputs={"word": "w"}))["shared_run_id"]
        done = await until(lambda: _succeeded(op, srid), what="the run to succeed")
        eid = done["execution_id"]

        report = await ok(op, "run_report", shared_run_id=srid)
        assert (report["execution_id"], report["status"]) == (eid, "Succeeded")
        assert report["critical_path"]["steps"] == ["a", "b"]
        assert (report["retries"], report["recoveries"]) == (0, 0)
        trace = await ok(op, "run_trace", shared_run_id=srid)
        assert [(st["step"], st["status"]) for st in trace["steps"]] == [
            ("a", "completed"),
            ("b", "completed"),
        ]
        assert trace["instances"] == [done["assigned_instance_id"]]
        ledger = await ok(op, "run_ledger", shared_run_id=srid, limit=999)
        assert ledger["execution_id"] == eid and ledger["next_cursor"] is None
        types = [e["type"] for e in ledger["events"]]
        completed = sorted(
            f["step"]
            for e in ledger["events"]
            for kind, f in per_step(e["type"], e["fields"])
            if kind == "step_completed"
        )
        assert types[0] == "execution_created" and completed == ["a", "b"]
        [resource] = (await op.read_resource(f"airuntime://runs/{srid}/ledger")).contents
        assert isinstance(resource, TextResourceContents)
        assert json.loads(resource.text) == ledger
        [details] = (await op.read_resource(f"airuntime://runs/{srid}")).contents
        assert isinstance(details, TextResourceContents)
        assert json.loads(details.text)["steps"] == done["steps"]

        replay = await ok(op, "replay_run", shared_run_id=srid)
        again = await until(
            lambda: _succeeded(op, replay["shared_run_id"]), what="the replay to succeed"
        )
        assert again["replay_of"] == srid and again["execution_id"] != eid
        assert again["steps"]["b"]["output"] == done["steps"]["b"]["output"] == "w"
        assert again["snapshot"] == done["snapshot"]
