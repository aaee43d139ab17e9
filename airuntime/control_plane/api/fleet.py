"""``/v1/instances`` and ``/v1/tenants``: the runtime instances and the tenant settings a
caller may see."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from airuntime.control_plane.api import operations
from airuntime.control_plane.api.deps import AUTHENTICATED, Context, Reader, error
from airuntime.control_plane.api.models import InstanceView
from airuntime.control_plane.rbac import TENANT_ID_PATTERN
from airuntime.fleet.tenancy import TenantSettings

router = APIRouter(prefix="/v1", tags=["fleet"], responses=AUTHENTICATED)

TenantId = Annotated[str, Path(pattern=TENANT_ID_PATTERN, description="A tenant id (DNS label).")]


@router.get("/instances", response_model=list[InstanceView])
async def instances(who: Reader, context: Context) -> list[InstanceView]:
    """The instances the caller's tenant may run on, each with its suspect mark (an
    instance admission skips for a while because deliveries to it failed)."""
    return await operations.instances(context, who)


@router.get(
    "/tenants/{tenant_id}/settings",
    response_model=TenantSettings,
    responses={404: error("Not the caller's tenant.")},
)
async def tenant_settings(tenant_id: TenantId, who: Reader, context: Context) -> TenantSettings:
    return await operations.tenant_settings(context, who, tenant_id)
