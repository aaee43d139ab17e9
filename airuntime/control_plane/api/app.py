"""The FastAPI application: the routers, their shared context, and the error mapping."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from airuntime.control_plane.api import fleet, health, queue, runs
from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator
from airuntime.control_plane.service import ControlPlane, ControlPlaneError


def create_app(
    control_plane: ControlPlane, auth: Authenticator, metrics: ControlPlaneMetrics | None = None
) -> FastAPI:
    app = FastAPI(title="airuntime control plane", version="v1")
    app.state.airuntime = ApiContext(control_plane, auth, metrics)

    @app.exception_handler(ControlPlaneError)
    async def _refused(request: Request, exc: ControlPlaneError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    for module in (health, runs, queue, fleet):
        app.include_router(module.router)
    return app
