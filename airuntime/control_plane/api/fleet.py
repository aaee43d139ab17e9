"""``/v1/instances``, ``/v1/model-providers`` and ``/v1/tenants``: the runtime instances,
the model providers, the tenant settings and the names of a tenant's secrets a caller
may see, and the settings and secrets an operator or an admin may change (the same
operations as the MCP tools ``set_tenant_settings`` and ``set_step_slots``; secrets are
set through this API only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from airuntime.control_plane.api import operations
from airuntime.control_plane.api.deps import (
    AUTHENTICATED,
    WITH_BODY,
    Admin,
    Canceller,
    Context,
    Reader,
    error,
)
from airuntime.control_plane.api.models import (
    InstanceView,
    ModelProviderView,
    ModelUsageView,
    SecretRequest,
    SecretView,
    StepSlotsRequest,
)
from airuntime.control_plane.api.operations import InvalidField
from airuntime.control_plane.api.request_body import StrictJsonRoute
from airuntime.control_plane.rbac import TENANT_ID_PATTERN
from airuntime.engine.secret_refs import SECRET_NAME_PATTERN
from airuntime.engine.tenant_secrets import MAX_SECRETS_PER_TENANT
from airuntime.fleet.tenancy import TenantSettings

router = APIRouter(
    prefix="/v1", tags=["fleet"], route_class=StrictJsonRoute, responses=AUTHENTICATED
)

TenantId = Annotated[str, Path(pattern=TENANT_ID_PATTERN, description="A tenant id (DNS label).")]
SecretName = Annotated[
    str,
    Path(
        pattern=f"^{SECRET_NAME_PATTERN}$",
        description="A secret's name: a letter or _, then letters, digits or _ (at most 64).",
    ),
]


@router.get("/instances", response_model=list[InstanceView])
async def instances(who: Reader, context: Context) -> list[InstanceView]:
    """The instances the caller's tenant may run on, each with its suspect mark (an
    instance admission skips for a while because deliveries to it failed)."""
    return await operations.instances(context, who)


@router.get("/model-providers", response_model=list[ModelProviderView])
async def model_providers(who: Reader, context: Context) -> list[ModelProviderView]:
    """The model providers the caller's tenant may name in `model` steps (the platform's,
    within the tenant's `allowed_model_providers`): names, APIs, models, token caps;
    never where they are or the keys they are called with."""
    return await operations.model_providers(context, who)


@router.get(
    "/tenants/{tenant_id}/settings",
    response_model=TenantSettings,
    responses={404: error("Not the caller's tenant.")},
)
async def tenant_settings(tenant_id: TenantId, who: Reader, context: Context) -> TenantSettings:
    return await operations.tenant_settings(context, who, tenant_id)


@router.put(
    "/tenants/{tenant_id}/settings",
    response_model=TenantSettings,
    # 422 (FastAPI's validation error, documented by default): invalid settings, or a
    # body naming another tenant than the path (``tenant_id``).
    responses={**WITH_BODY, 403: error("The caller lacks the admin capability.")},
)
async def put_tenant_settings(
    tenant_id: TenantId, settings: TenantSettings, who: Admin, context: Context
) -> TenantSettings:
    """Store a tenant's settings whole (admin): admission reads them at the next
    dispatch; the tenant's runtimes apply ``max_concurrent_step_tasks`` live."""
    if settings.tenant_id != tenant_id:
        raise InvalidField(
            "tenant_id", f"{settings.tenant_id!r} is not the tenant of the path, {tenant_id!r}"
        )
    return await operations.put_tenant_settings(context, who, settings)


@router.put(
    "/tenants/{tenant_id}/step-slots",
    response_model=TenantSettings,
    responses={
        **WITH_BODY,
        403: error("The caller lacks the cancel capability (operators have it)."),
        404: error("Not the caller's tenant."),
    },
)
async def set_step_slots(
    tenant_id: TenantId, body: StepSlotsRequest, who: Canceller, context: Context
) -> TenantSettings:
    """Change how many step handlers the tenant's runtimes run at once (its own tenant,
    or any as admin); the runtimes apply it live."""
    return await operations.set_step_slots(context, who, tenant_id, body.limit)


@router.get(
    "/tenants/{tenant_id}/model-usage",
    response_model=ModelUsageView,
    responses={404: error("Not the caller's tenant.")},
)
async def model_usage(tenant_id: TenantId, who: Reader, context: Context) -> ModelUsageView:
    """The tenant's model token budget (`model_token_budget` of its settings) and the
    current window: tokens used, held by calls going on, remaining, when it renews."""
    return await operations.model_usage(context, who, tenant_id)


@router.get(
    "/tenants/{tenant_id}/secrets",
    response_model=list[SecretView],
    responses={404: error("Not the caller's tenant.")},
)
async def secrets(tenant_id: TenantId, who: Reader, context: Context) -> list[SecretView]:
    """The tenant's secrets, by name and when each was set: never a value (no route
    answers one; only a runtime reads it, right before an http step sends it)."""
    return await operations.secrets(context, who, tenant_id)


@router.put(
    "/tenants/{tenant_id}/secrets/{name}",
    response_model=SecretView,
    responses={
        **WITH_BODY,
        403: error("The caller lacks the cancel capability (operators have it)."),
        404: error("Not the caller's tenant."),
        409: error(f"A new name for a tenant that keeps {MAX_SECRETS_PER_TENANT} secrets already."),
    },
)
async def put_secret(
    tenant_id: TenantId, name: SecretName, body: SecretRequest, who: Canceller, context: Context
) -> SecretView:
    """Set one secret of the tenant (created or replaced): ``${secrets.<name>}`` in an
    http step's header values sends it; outputs and errors show ``***`` in its place."""
    return await operations.put_secret(context, who, tenant_id, name, body.value)


@router.delete(
    "/tenants/{tenant_id}/secrets/{name}",
    status_code=204,
    responses={
        403: error("The caller lacks the cancel capability (operators have it)."),
        404: error("Not the caller's tenant, or no secret of that name."),
    },
)
async def delete_secret(
    tenant_id: TenantId, name: SecretName, who: Canceller, context: Context
) -> Response:
    """Forget one secret of the tenant; steps naming it fail from then on, naming it."""
    await operations.delete_secret(context, who, tenant_id, name)
    return Response(status_code=204)
