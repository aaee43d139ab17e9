"""Unauthenticated probes: ``/healthz`` (the process answers), ``/readyz`` (Redis
answers) and ``/metrics`` (Prometheus text, when metrics are enabled)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from airuntime.control_plane.api.deps import Context
from airuntime.control_plane.api.models import ErrorBody, Health, NotReady, Ready

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Ready,
    responses={503: {"model": NotReady, "description": "Redis does not answer."}},
)
async def readyz(context: Context) -> Ready | JSONResponse:
    cp = context.control_plane
    try:
        await cp.redis.ping()
    except Exception as exc:
        body = NotReady(status="redis unreachable", detail=str(exc))
        return JSONResponse(body.model_dump(), status_code=503)
    return Ready(status="ready", background_pump_ready=cp.background.ready.is_set())


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."},
        404: {"model": ErrorBody, "description": "Metrics are not enabled."},
    },
)
async def metrics(context: Context) -> Response:
    if context.metrics is None:
        raise HTTPException(404, "metrics are not enabled")
    await context.metrics.refresh()
    return Response(generate_latest(context.metrics.registry), media_type=CONTENT_TYPE_LATEST)
