"""Helpers of the run read & steer suite (real API calls, deadlines not sleeps)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.control_plane.support import wait_for
from tests.runs.conftest import auth

ENDED = frozenset({"Succeeded", "Failed", "Cancelled", "Rejected"})

FAN = {
    "id": "fan",
    "steps": [
        {"id": "root", "uses": "echo", "with": {"value": "r"}},
        {
            "id": "left",
            "uses": "sleep",
            "with": {"seconds": 0.02, "value": "L"},
            "depends_on": ["root"],
        },
        {"id": "right", "uses": "echo", "with": {"value": "${steps.root.output}"}},
        {
            "id": "flaky",
            "uses": "fail",
            "with": {"fail_attempts": 1, "value": "ok"},
            "retry": {"max_attempts": 3, "backoff_initial_s": 0.01},
            "depends_on": ["right"],
        },
        {"id": "sink", "uses": "noop", "depends_on": ["left", "flaky"]},
    ],
}


async def submit(client: httpx.AsyncClient, pipeline: dict[str, Any], who: str = "alice-a") -> str:
    resp = await client.post("/v1/runs", json={"pipeline": pipeline}, headers=auth(who))
    assert resp.status_code == 202, resp.text
    srid: str = resp.json()["shared_run_id"]
    return srid


async def ended(client: httpx.AsyncClient, srid: str, who: str = "alice-a") -> dict[str, Any]:
    """The run's details once its shared run ended (the runtime's evidence is in)."""

    async def probe() -> dict[str, Any] | None:
        resp = await client.get(f"/v1/runs/{srid}", headers=auth(who))
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        return body if body["status"] in ENDED else None

    return await wait_for(probe, timeout_s=60, what=f"{srid} to end")


async def step_status(
    client: httpx.AsyncClient, srid: str, step: str, want: str, who: str = "alice-a"
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/v1/runs/{srid}", headers=auth(who))).json()
        steps = body.get("steps") or {}
        return body if steps.get(step, {}).get("status") == want else None

    return await wait_for(probe, timeout_s=60, what=f"{srid}: step {step} {want}")
