"""The HTTP API of a runtime host.

Why a module of its own: what the host answers over HTTP -- probes and metrics, the
``http`` provider's run intake, the live settings -- is a thin translation of the
host's state into status codes, separate from how the host starts and stops its
instances (:mod:`runtime_pod.host`).

``/healthz``; ``/readyz`` (200 once every child is registered and publishing
capacity); ``/metrics``; ``POST /v1/instances/{id}/runs`` and ``GET /v1/instances``;
``GET /v1/settings`` and ``PUT /v1/settings/{key}`` (live settings, persisted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from runtime_pod.instance import RunRefused
from runtime_pod.settings_store import SettingsError

if TYPE_CHECKING:
    from runtime_pod.host import RuntimeHost

__all__ = ["SettingValue", "host_router"]


class SettingValue(BaseModel):
    # Any JSON value: the settings store validates it strictly and answers 400 naming
    # the key and value (``int | str`` here turned ``true`` into 1 and 4.5 into a 422).
    value: Any


def host_router(host: RuntimeHost) -> APIRouter:
    """Every route of ``host``'s API."""
    router = APIRouter()
    _probes(router, host)
    _intake(router, host)
    _settings(router, host)
    return router


def _probes(router: APIRouter, host: RuntimeHost) -> None:
    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> Response:
        if host.ready:
            return JSONResponse(
                {"status": "ready", "instances": [i.instance_id for i in host.instances]}
            )
        return JSONResponse({"status": "starting"}, status_code=503)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(host.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _refusal(error: str, reason: str, status_code: int) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status_code=status_code)


def _intake(router: APIRouter, host: RuntimeHost) -> None:
    @router.post("/v1/instances/{instance_id}/runs")
    async def accept(instance_id: str, request: Request) -> Response:
        inst = host.instance(instance_id)
        if inst is None:
            raise HTTPException(404, f"runtime instance {instance_id!r} is not hosted here")
        try:
            body = await request.json()
        except ValueError:
            return _refusal("body is not JSON", "invalid", 400)
        if not isinstance(body, dict):
            return _refusal("run request must be a JSON object", "invalid", 400)
        try:
            run_id = await inst.accept(body)
        except RunRefused as exc:
            return _refusal(str(exc), exc.reason, 400 if exc.reason == "invalid" else 409)
        return JSONResponse({"run_id": run_id}, status_code=202)

    @router.get("/v1/instances")
    async def instances() -> list[dict[str, Any]]:
        return [(await i.descriptor()).model_dump(mode="json") for i in host.instances]


def _settings(router: APIRouter, host: RuntimeHost) -> None:
    @router.get("/v1/settings")
    async def get_settings() -> dict[str, Any]:
        limit = host.instances[0].slots.limit if host.instances else 0
        return {"max_concurrent_step_tasks": limit}

    @router.put("/v1/settings/{key}")
    async def put_setting(key: str, body: SettingValue) -> dict[str, Any]:
        if host.settings_store is None:
            raise HTTPException(409, "this host has no settings file")
        try:
            settings = host.settings_store.set(key, body.value)
        except SettingsError as exc:
            raise HTTPException(400, str(exc)) from None
        return settings.model_dump()
