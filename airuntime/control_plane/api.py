"""The control plane's HTTP API (FastAPI; OpenAPI at ``/openapi.json``).

Every ``/v1`` endpoint needs a bearer token (:mod:`airuntime.control_plane.rbac`); the caller's
tenant becomes the run's snapshot and scopes every read, so no endpoint returns
another tenant's data (an invisible run answers 404, exactly like a missing one).
Bad requests get a 4xx naming the field, never a 500.
"""

import time
from typing import Annotated, Any

import yaml
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, Capability, Principal
from airuntime.control_plane.service import ControlPlane, ControlPlaneError
from airuntime.control_plane.settings import SubmitMode


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: dict[str, Any] | None = Field(default=None, description="Pipeline document.")
    pipeline_yaml: str | None = Field(default=None, description="Pipeline as YAML text.")
    inputs: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    mode: SubmitMode | None = None
    project: str | None = None

    @model_validator(mode="after")
    def _one_pipeline(self) -> "SubmitRequest":
        if (self.pipeline is None) == (self.pipeline_yaml is None):
            raise ValueError("give exactly one of pipeline or pipeline_yaml")
        return self

    def document(self) -> dict[str, Any]:
        if self.pipeline is not None:
            return self.pipeline
        try:
            doc = yaml.safe_load(self.pipeline_yaml or "")
        except yaml.YAMLError as exc:
            raise HTTPException(400, f"pipeline_yaml: not valid YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise HTTPException(400, "pipeline_yaml: must be a mapping")
        return doc


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_count: int = Field(default=100, ge=1, le=100_000)


def create_app(
    control_plane: ControlPlane, auth: Authenticator, metrics: ControlPlaneMetrics | None = None
) -> FastAPI:
    app = FastAPI(title="airuntime control plane", version="v1")
    bearer = HTTPBearer(auto_error=False)
    cp = control_plane

    async def principal(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        if creds is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        who = auth.authenticate(creds.credentials)
        if who is None:
            raise HTTPException(401, "unknown bearer token", headers={"WWW-Authenticate": "Bearer"})
        return who

    def need(capability: Capability) -> Any:
        async def check(who: Annotated[Principal, Depends(principal)]) -> Principal:
            if not who.can(capability):
                raise HTTPException(
                    403, f"user {who.user!r} lacks the {capability.value!r} capability"
                )
            return who

        return Depends(check)

    @app.exception_handler(ControlPlaneError)
    async def _cp_error(request: Request, exc: ControlPlaneError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        try:
            await cp.redis.ping()
        except Exception as exc:
            return JSONResponse(
                {"status": "redis unreachable", "detail": str(exc)}, status_code=503
            )
        return JSONResponse(
            {"status": "ready", "background_pump_ready": cp.background.ready.is_set()}
        )

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        if metrics is None:
            raise HTTPException(404, "metrics are not enabled")
        await metrics.refresh()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/runs", status_code=202)
    async def submit(
        body: SubmitRequest, who: Annotated[Principal, need(Capability.SUBMIT)]
    ) -> dict[str, Any]:
        run = await cp.submit(
            body.document(),
            who.snapshot(body.project),
            inputs=body.inputs,
            metadata=body.metadata,
            mode=body.mode,
        )
        return {
            "shared_run_id": run.shared_run_id,
            "status": run.status.value,
            "assigned_instance_id": run.assigned_instance_id,
            "run_id": run.run_id,
        }

    @app.get("/v1/runs/{shared_run_id}")
    async def get_run(
        shared_run_id: str, who: Annotated[Principal, need(Capability.READ)]
    ) -> dict[str, Any]:
        body = await cp.get(shared_run_id, who.tenant_id)
        if body is None:
            raise HTTPException(404, f"shared run {shared_run_id!r} not found")
        return body

    @app.get("/v1/runs")
    async def list_runs(
        who: Annotated[Principal, need(Capability.READ)], limit: int = 100
    ) -> list[dict[str, Any]]:
        if not 1 <= limit <= 1000:
            raise HTTPException(400, f"limit: must be between 1 and 1000, got {limit}")
        runs = await cp.list(who.tenant_id, limit)
        return [r.model_dump(mode="json", exclude={"pipeline"}) for r in runs]

    @app.post("/v1/runs/{shared_run_id}/cancel")
    async def cancel(
        shared_run_id: str, who: Annotated[Principal, need(Capability.CANCEL)]
    ) -> dict[str, Any]:
        run = await cp.cancel(shared_run_id, who.tenant_id)
        if run is None:
            raise HTTPException(404, f"shared run {shared_run_id!r} not found")
        return {
            "shared_run_id": run.shared_run_id,
            "status": run.status.value,
            "reason": run.reason,
        }

    @app.post("/v1/queue/drain")
    async def drain(
        who: Annotated[Principal, need(Capability.DRAIN)], body: DrainRequest | None = None
    ) -> dict[str, Any]:
        started = time.perf_counter()
        result = await cp.drain((body or DrainRequest()).max_count)
        return {
            "dispatched": result.dispatched,
            "failed": result.failed,
            "cycles": result.cycles,
            "stopped": result.stopped,
            "seconds": round(time.perf_counter() - started, 4),
        }

    @app.get("/v1/queue")
    async def queue(who: Annotated[Principal, need(Capability.READ)]) -> dict[str, Any]:
        by_tenant = await cp.queue.pending_by_tenant()
        if not who.can(Capability.ADMIN):
            by_tenant = {t: n for t, n in by_tenant.items() if t == who.tenant_id}
        return {"pending": sum(by_tenant.values()), "pending_by_tenant": by_tenant}

    @app.get("/v1/instances")
    async def instances(who: Annotated[Principal, need(Capability.READ)]) -> list[dict[str, Any]]:
        tenant = await cp.registry.tenant(who.tenant_id)
        return [d.model_dump(mode="json") for d in await cp.registry.list_visible(tenant)]

    @app.get("/v1/tenants/{tenant_id}/settings")
    async def tenant_settings(
        tenant_id: str, who: Annotated[Principal, need(Capability.READ)]
    ) -> dict[str, Any]:
        if tenant_id != who.tenant_id and not who.can(Capability.ADMIN):
            raise HTTPException(404, f"tenant {tenant_id!r} not found")
        return (await cp.registry.tenant(tenant_id)).model_dump(mode="json")

    return app
