"""Unauthenticated probes: ``/healthz`` (the process answers), ``/readyz`` (Redis answers
and every background loop works) and ``/metrics`` (Prometheus text, when enabled)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from airuntime.control_plane.api.deps import UNAVAILABLE, Context, error
from airuntime.control_plane.api.models import Health, NotReady, Ready

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Ready,
    responses={
        503: {
            "model": NotReady,
            "description": "Redis does not answer, or a background loop is failing.",
        }
    },
)
async def readyz(context: Context) -> Ready | JSONResponse:
    cp = context.control_plane
    try:
        await cp.redis.ping()
    except (RedisError, OSError) as exc:
        body = NotReady(status="redis unreachable", detail=f"{type(exc).__name__}: {exc}")
        return JSONResponse(body.model_dump(), status_code=503)
    unhealthy = cp.unhealthy_loops()
    if unhealthy:
        report = cp.supervisor.report()
        errors = "; ".join(
            f"{n}: {report[n]['last_error'] or report[n]['state']}" for n in unhealthy
        )
        body = NotReady(status="loops unhealthy", detail=errors, unhealthy_loops=unhealthy)
        return JSONResponse(body.model_dump(), status_code=503)
    return Ready(status="ready", background_pump_ready=cp.background.ready.is_set())


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format (version 0.0.4).",
        },
        404: error("Metrics are not enabled."),
        **UNAVAILABLE,
    },
)
async def metrics(context: Context) -> PlainTextResponse:
    if context.metrics is None:
        raise HTTPException(404, "metrics are not enabled")
    await context.metrics.refresh()
    return PlainTextResponse(
        generate_latest(context.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
