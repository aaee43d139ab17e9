"""The HTTP API of a runtime host.

Why a module of its own: what the host answers over HTTP -- probes and metrics, the
``http`` provider's run intake, the live settings -- is a thin translation of the
host's state into status codes, separate from how the host starts and stops its
instances (:mod:`runtime_pod.host`).

Open: ``/healthz``; ``/readyz`` (200 once every child is registered and none of their
background loops is failing; 503 naming the failing loops otherwise); ``/metrics``.

With the host's runtime token (``Authorization: Bearer <token>``, compared in constant
time; 401 when missing or wrong, and always when the host has no token): ``POST
/v1/instances/{id}/runs`` (202 with the RunId; a refusal is 400 ``invalid``, 403
``not_visible``, 409 otherwise; 503 ``unavailable`` while Redis is away: accepting is
idempotent, the sender retries), ``GET /v1/instances``, ``GET /v1/settings`` and ``PUT
/v1/settings/{key}`` (live settings, persisted).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any, NoReturn

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from airuntime.core.transient import TRANSIENT_ERRORS
from airuntime.fleet.instance_settings import RUNTIME_TOKEN_ENV
from runtime_pod.intake import REFUSAL_HTTP_STATUS, RunRefused
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
    guarded = APIRouter(dependencies=[Depends(_token_check(host))])
    _intake(guarded, host)
    _settings(guarded, host)
    router.include_router(guarded)
    return router


def _token_check(host: RuntimeHost) -> Any:
    async def check(request: Request) -> None:
        if host.token is None:
            _unauthorized(
                f"this runtime host has no runtime token ({RUNTIME_TOKEN_ENV}): "
                "its run intake and settings API are closed"
            )
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            _unauthorized("a bearer token is required (Authorization: Bearer <runtime token>)")
        if not hmac.compare_digest(given.strip().encode(), host.token.encode()):
            _unauthorized("invalid runtime token")

    return check


def _unauthorized(detail: str) -> NoReturn:
    raise HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


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
        unhealthy = host.unhealthy()
        if unhealthy:
            return JSONResponse(
                {"status": "unhealthy", "unhealthy_loops": unhealthy}, status_code=503
            )
        return JSONResponse({"status": "starting"}, status_code=503)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(host.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _refusal(error: str, reason: str) -> JSONResponse:
    status = REFUSAL_HTTP_STATUS.get(reason, 409)
    return JSONResponse({"error": error, "reason": reason}, status_code=status)


def _intake(router: APIRouter, host: RuntimeHost) -> None:
    @router.post("/v1/instances/{instance_id}/runs")
    async def accept(instance_id: str, request: Request) -> Response:
        inst = host.instance(instance_id)
        if inst is None:
            raise HTTPException(404, f"runtime instance {instance_id!r} is not hosted here")
        try:
            body = await request.json()
        except ValueError:
            return _refusal("body is not JSON", "invalid")
        if not isinstance(body, dict):
            return _refusal("run request must be a JSON object", "invalid")
        try:
            run_id = await inst.accept(body)
        except RunRefused as exc:
            return _refusal(str(exc), exc.reason)
        except TRANSIENT_ERRORS as exc:  # nothing or everything was written: retry later
            return JSONResponse(
                {"error": f"Redis unavailable: {exc}", "reason": "unavailable"}, status_code=503
            )
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
