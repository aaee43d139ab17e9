"""The FastAPI application: the routers, their shared context, and the error mapping.

Every refusal has a status and a body the OpenAPI document names: 400 (a body that is
not JSON at all), 401, 403, 404, 409, 413, 422 (FastAPI's validation-error shape, also
for an invalid pipeline and a non-finite number), and 503 with ``Retry-After`` when
Redis does not answer -- never a 500 for something the caller or the network did.
"""

from __future__ import annotations

from typing import Final

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from airuntime.control_plane.api import fleet, health, queue, run_reads, run_steer, runs
from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.api.operations import InvalidField
from airuntime.control_plane.api.request_body import BodyLimit
from airuntime.control_plane.console import install as install_console
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, NotAllowed
from airuntime.control_plane.service import ControlPlane, ControlPlaneError, PipelineRefused
from airuntime.history.errors import HistoryUnavailable
from airuntime.history.store import HistoryStore

MCP_PATH: Final = "/mcp"
"""Where the MCP server answers (streamable HTTP), on the API's port."""
RETRY_AFTER_S: Final = 5
"""What a 503 asks the caller to wait before trying again, seconds."""


def create_app(
    control_plane: ControlPlane,
    auth: Authenticator,
    metrics: ControlPlaneMetrics | None = None,
    history: HistoryStore | None = None,
) -> FastAPI:
    """The API over ``control_plane``; run reads fall back to ``history`` (the durable
    archive) for runs Redis no longer holds."""
    app = FastAPI(title="airuntime control plane", version="v1")
    app.state.airuntime = ApiContext(control_plane, auth, metrics, history)
    app.add_middleware(BodyLimit, limit=control_plane.settings.max_request_bytes)
    _answer_refusals(app)
    for module in (health, run_reads, run_steer, runs, queue, fleet):
        app.include_router(module.router)
    install_console(app)  # the web console at /ui: same tokens and roles, a cookie session
    if control_plane.settings.mcp_enabled:
        # Imported here: the MCP package imports this package's operations.
        from airuntime.control_plane.mcp.server import McpEndpoint

        endpoint = McpEndpoint(app.state.airuntime, auth)
        app.state.mcp = endpoint
        app.add_route(MCP_PATH, endpoint, include_in_schema=False)  # type: ignore[arg-type]
    return app


def _answer_refusals(app: FastAPI) -> None:
    """Every refusal the operations raise, as the HTTP answer it stands for (4xx; 503
    with Retry-After when Redis or the history is unavailable)."""

    @app.exception_handler(PipelineRefused)
    async def _invalid_pipeline(request: Request, exc: PipelineRefused) -> JSONResponse:
        detail = [
            {"type": "pipeline", "loc": ["body", "pipeline", *loc], "msg": msg}
            for loc, msg in exc.problems
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(InvalidField)
    async def _invalid_field(request: Request, exc: InvalidField) -> JSONResponse:
        detail = [{"type": "value_error", "loc": ["body", exc.field], "msg": exc.detail}]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(ControlPlaneError)
    async def _refused(request: Request, exc: ControlPlaneError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(NotAllowed)
    async def _not_allowed(request: Request, exc: NotAllowed) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def _redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": f"Redis is not available ({type(exc).__name__}); retry later"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    @app.exception_handler(HistoryUnavailable)
    async def _history_unavailable(request: Request, exc: HistoryUnavailable) -> JSONResponse:
        return JSONResponse(
            {"detail": f"the durable history is not available ({exc}); retry later"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


def begin_closing(app: FastAPI) -> None:
    """The server is about to stop: end the event streams being followed (see
    ``ApiContext.closing``). Call it before the server's ``should_exit``."""
    context: ApiContext = app.state.airuntime
    context.closing.set()


async def close_app(app: FastAPI) -> None:
    """Stop what the app started on its own (the MCP endpoint's session manager); the
    API runs without an ASGI lifespan, so its server calls this when it stops."""
    endpoint = getattr(app.state, "mcp", None)
    if endpoint is not None:
        await endpoint.close()
