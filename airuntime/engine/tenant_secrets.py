"""A tenant's secrets: values its ``http`` steps send in headers, stored write-only.

Why this exists: see :mod:`airuntime.engine.secret_refs` (a credential written in a
pipeline is in the plan, the run's record and its history). Values are written through
the control plane (``PUT /v1/tenants/{tenant}/secrets/{name}``, ``airt secrets set``) and
read back by nobody but a runtime, right before it sends a request of a step of that
tenant's run: the API, the MCP server and the CLI list names and when each was set,
never a value.

Storage: one Redis hash a tenant (:func:`airuntime.core.keys.tenant_secrets`), name ->
``{"value", "updated_at_ms", "updated_by"}`` JSON; the tenant id is the only partition
key, so a run reads the secrets of its own tenant and no other. Values are held as
Redis holds every run's inputs and outputs (see the README's trust model: the runtimes
and the control plane hold the Redis credentials; encryption at rest is the server's).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.engine.secret_refs import SECRET_NAME_PATTERN

__all__ = [
    "MAX_SECRETS_PER_TENANT",
    "MAX_SECRET_VALUE_CHARS",
    "MIN_SECRET_VALUE_CHARS",
    "GivenSecrets",
    "SecretInfo",
    "SecretSource",
    "TenantSecrets",
    "TooManySecrets",
    "value_problem",
]

MAX_SECRETS_PER_TENANT: Final = 100
MAX_SECRET_VALUE_CHARS: Final = 4096
MIN_SECRET_VALUE_CHARS: Final = 4
"""Shorter values would mask ordinary text wherever a step's output is scrubbed."""
NAME_RE: Final = re.compile(SECRET_NAME_PATTERN)
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


class TooManySecrets(Exception):
    """A new name for a tenant that keeps :data:`MAX_SECRETS_PER_TENANT` already."""


def value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a secret (it goes into an HTTP header), or None. The value
    itself is never quoted."""
    if len(value) < MIN_SECRET_VALUE_CHARS:
        return (
            f"is {len(value)} characters, under the minimum of {MIN_SECRET_VALUE_CHARS} "
            "(outputs are scrubbed of secret values; a shorter one would mask ordinary text)"
        )
    if len(value) > MAX_SECRET_VALUE_CHARS:
        return f"is {len(value)} characters, over the limit of {MAX_SECRET_VALUE_CHARS}"
    bad = _NOT_PRINTABLE_ASCII.search(value)
    if bad is not None:
        return (
            f"contains a character that is not printable ASCII (code {ord(bad.group())} at "
            f"position {bad.start()}): it is sent in an HTTP header"
        )
    return None


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """What anyone may know of a stored secret: its name, when and by whom it was set."""

    name: str
    updated_at_ms: int
    updated_by: str


class TenantSecrets:
    """The secrets of every tenant on one Redis (each call names the tenant)."""

    def __init__(self, redis: RedisClient, scripts: ScriptLibrary | None = None) -> None:
        self.redis = redis
        self.scripts = scripts or library()

    async def put(self, tenant_id: str, name: str, value: str, updated_by: str) -> SecretInfo:
        """Store ``value`` (checked by the caller: :func:`value_problem`) and answer what
        anyone may know of it. Raises :class:`TooManySecrets` for a new name over the cap."""
        info = SecretInfo(name, int(time.time() * 1000), updated_by)
        record = json.dumps(
            {"value": value, "updated_at_ms": info.updated_at_ms, "updated_by": updated_by}
        )
        reply = await self.scripts.call(
            self.redis,
            "putTenantSecret",
            [keys.tenant_secrets(tenant_id)],
            [name, record, MAX_SECRETS_PER_TENANT],
        )
        if int(reply) == 0:
            raise TooManySecrets(
                f"tenant {tenant_id!r} keeps {MAX_SECRETS_PER_TENANT} secrets already, the "
                "most it may: delete one first"
            )
        return info

    async def delete(self, tenant_id: str, name: str) -> bool:
        """Forget one secret; False when there was none of that name."""
        return bool(await self.redis.hdel(keys.tenant_secrets(tenant_id), name))

    async def listing(self, tenant_id: str) -> list[SecretInfo]:
        """The tenant's secrets by name, without their values."""
        raw: dict[Any, Any] = await self.redis.hgetall(keys.tenant_secrets(tenant_id))
        out = []
        for k, v in raw.items():
            record = _record(v)
            out.append(
                SecretInfo(
                    name=k.decode() if isinstance(k, bytes) else str(k),
                    updated_at_ms=int(record.get("updated_at_ms") or 0),
                    updated_by=str(record.get("updated_by") or ""),
                )
            )
        return sorted(out, key=lambda s: s.name)

    async def _stored(self, tenant_id: str, names: Collection[str]) -> dict[str, Any]:
        """The stored records of those of ``names`` the tenant has, by name (one HMGET)."""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        found = await self.redis.hmget(keys.tenant_secrets(tenant_id), wanted)
        return {n: raw for n, raw in zip(wanted, found, strict=True) if raw is not None}

    async def missing(self, tenant_id: str, names: Collection[str]) -> list[str]:
        """Which of ``names`` the tenant has not stored, sorted."""
        return sorted(set(names) - (await self._stored(tenant_id, names)).keys())

    async def values(self, tenant_id: str, names: Collection[str]) -> dict[str, str]:
        """The values of ``names`` of the tenant's secrets; a name it has not stored is
        left out (the caller names what is missing)."""
        out: dict[str, str] = {}
        for name, raw in (await self._stored(tenant_id, names)).items():
            value = _record(raw).get("value")
            if isinstance(value, str) and value:
                out[name] = value
        return out


class SecretSource(Protocol):
    """Where a worker pool reads the values an ``http`` step's headers name."""

    async def values(self, tenant_id: str, names: Collection[str]) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class GivenSecrets:
    """Values handed to one process (``airt run --secret NAME``), for whatever tenant it
    runs as; kept in memory, never written to Redis."""

    given: Mapping[str, str]

    async def values(self, tenant_id: str, names: Collection[str]) -> dict[str, str]:
        return {n: self.given[n] for n in names if n in self.given}


def _record(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
