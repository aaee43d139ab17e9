"""``/v1/instances`` and ``/v1/tenants``: the runtime instances and the tenant settings a
caller may see."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from airuntime.control_plane.api.deps import Context, Reader
from airuntime.control_plane.api.models import ErrorBody
from airuntime.control_plane.rbac import Capability
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.tenancy import TenantSettings

router = APIRouter(prefix="/v1", tags=["fleet"])


@router.get("/instances", response_model=list[InstanceDescriptor])
async def instances(who: Reader, context: Context) -> list[InstanceDescriptor]:
    """The instances the caller's tenant may run on."""
    registry = context.control_plane.registry
    return await registry.list_visible(await registry.tenant(who.tenant_id))


@router.get(
    "/tenants/{tenant_id}/settings",
    response_model=TenantSettings,
    responses={404: {"model": ErrorBody, "description": "Not the caller's tenant."}},
)
async def tenant_settings(tenant_id: str, who: Reader, context: Context) -> TenantSettings:
    if tenant_id != who.tenant_id and not who.can(Capability.ADMIN):
        raise HTTPException(404, f"tenant {tenant_id!r} not found")
    return await context.control_plane.registry.tenant(tenant_id)
