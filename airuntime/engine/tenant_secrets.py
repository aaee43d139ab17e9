"""A tenant's secrets: values its ``http`` steps send in headers, stored write-only.

Why this exists: see :mod:`airuntime.engine.secret_refs` (a credential written in a
pipeline is in the plan, the run's record and its history). Values are written through
the control plane (``PUT /v1/tenants/{tenant}/secrets/{name}``, ``airt secrets set``) and
read back by nobody but a runtime, right before it sends a request of a step of that
tenant's run: the API, the MCP server and the CLI list names and when each was set,
never a value.

Storage: one Redis hash a tenant (:func:`airuntime.core.keys.tenant_secrets`), name ->
``{"value", "updated_at_ms", "updated_by"}`` JSON; the tenant id is the only partition
key, so a run reads the secrets of its own tenant and no other. With
``AIRUNTIME_SECRETS_KEYS`` set the record holds the value sealed (``{"sealed", ...}``,
:mod:`airuntime.engine.secret_sealing`), never the value; without, the value as written.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Protocol

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.engine.secret_refs import SECRET_NAME_PATTERN
from airuntime.engine.secret_sealing import (
    SECRETS_KEYS_ENV,
    SealedValue,
    Sealer,
    Unsealable,
    configured_sealer,
)

__all__ = [
    "MAX_SECRETS_PER_TENANT",
    "MAX_SECRET_VALUE_CHARS",
    "MIN_SECRET_VALUE_CHARS",
    "GivenSecrets",
    "ResealReport",
    "SecretInfo",
    "SecretSource",
    "TenantSecrets",
    "TooManySecrets",
    "UnreadableSecret",
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


class UnreadableSecret(Exception):
    """A stored secret this process cannot read (sealed under a key it does not hold)."""

    def __init__(self, tenant_id: str, name: str, reason: str) -> None:
        super().__init__(f"secret {name!r} of tenant {tenant_id!r} cannot be read: {reason}")
        self.name = name


class _From(Enum):
    ENV = "env"


@dataclass(frozen=True, slots=True)
class ResealReport:
    """What ``reseal`` did over every tenant's secrets."""

    sealed: int
    """Values sealed (again) under the first key: stored as written, or under another."""
    current: int
    """Values sealed under the first key already (left as they were)."""
    changed: int
    """Values set meanwhile by someone else (left as they were: sealed by the setter)."""
    unreadable: list[str]
    """``tenant/name`` of values no key here opens (left as they were)."""


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
    sealed_with: str | None = None
    """The fingerprint of the key the value is sealed under; None: stored as written."""


class TenantSecrets:
    """The secrets of every tenant on one Redis (each call names the tenant)."""

    def __init__(
        self,
        redis: RedisClient,
        scripts: ScriptLibrary | None = None,
        sealer: Sealer | _From | None = _From.ENV,
    ) -> None:
        self.redis = redis
        self.scripts = scripts or library()
        self.sealer = configured_sealer() if sealer is _From.ENV else sealer
        """Seals the values written and opens the values read (None: as written); by
        default the one of ``AIRUNTIME_SECRETS_KEYS`` (a malformed one raises here)."""

    def _record(self, tenant_id: str, name: str, value: str, at_ms: int, by: str) -> str:
        record: dict[str, Any] = {"updated_at_ms": at_ms, "updated_by": by}
        if self.sealer is None:
            record["value"] = value
        else:
            record["sealed"] = self.sealer.seal(tenant_id, name, value).text
        return json.dumps(record)

    async def put(self, tenant_id: str, name: str, value: str, updated_by: str) -> SecretInfo:
        """Store ``value`` (checked by the caller: :func:`value_problem`), sealed when this
        process has keys, and answer what anyone may know of it. Raises
        :class:`TooManySecrets` for a new name over the cap."""
        at_ms = int(time.time() * 1000)
        sealed_with = None if self.sealer is None else self.sealer.fingerprint
        info = SecretInfo(name, at_ms, updated_by, sealed_with)
        record = self._record(tenant_id, name, value, at_ms, updated_by)
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
            sealed = record.get("sealed")
            out.append(
                SecretInfo(
                    name=k.decode() if isinstance(k, bytes) else str(k),
                    updated_at_ms=int(record.get("updated_at_ms") or 0),
                    updated_by=str(record.get("updated_by") or ""),
                    sealed_with=SealedValue(sealed).fingerprint
                    if isinstance(sealed, str)
                    else None,
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
        left out (the caller names what is missing). Raises :class:`UnreadableSecret`
        for a sealed value this process cannot open."""
        out: dict[str, str] = {}
        for name, raw in (await self._stored(tenant_id, names)).items():
            value = self._open(tenant_id, name, _record(raw))
            if value:
                out[name] = value
        return out

    def _open(self, tenant_id: str, name: str, record: dict[str, Any]) -> str | None:
        sealed = record.get("sealed")
        if not isinstance(sealed, str):
            value = record.get("value")
            return value if isinstance(value, str) else None
        if self.sealer is None:
            raise UnreadableSecret(
                tenant_id, name, f"it is sealed, and {SECRETS_KEYS_ENV} is not set here"
            )
        try:
            return self.sealer.open(tenant_id, name, SealedValue(sealed))
        except Unsealable as exc:
            raise UnreadableSecret(tenant_id, name, str(exc)) from None

    async def reseal(self) -> ResealReport:
        """Seal every tenant's stored values under the first key (values stored as
        written too): a key rotation's second step. Each record is replaced only if it is
        still the one read (``resealTenantSecret-1.lua``), so a value set meanwhile wins."""
        sealer = self.sealer
        if sealer is None:
            raise ValueError(f"{SECRETS_KEYS_ENV} is not set: there is no key to seal under")
        sealed = current = changed = 0
        unreadable: list[str] = []
        head, tail = keys.tenant_secrets("\n").split("\n")
        async for key in self.redis.scan_iter(match=keys.tenant_secrets("*"), count=500):
            hash_key = key.decode() if isinstance(key, bytes) else str(key)
            tenant_id = hash_key[len(head) : len(hash_key) - len(tail)]
            raw_all: dict[Any, Any] = await self.redis.hgetall(hash_key)
            for raw_name, raw in raw_all.items():
                name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
                record = _record(raw)
                stored = record.get("sealed")
                if (
                    isinstance(stored, str)
                    and SealedValue(stored).fingerprint == sealer.fingerprint
                ):
                    current += 1
                    continue
                try:
                    value = self._open(tenant_id, name, record)
                except UnreadableSecret:
                    unreadable.append(f"{tenant_id}/{name}")
                    continue
                if not value:
                    continue
                fresh = self._record(
                    tenant_id, name, value, int(record.get("updated_at_ms") or 0),
                    str(record.get("updated_by") or ""),
                )  # fmt: skip
                replaced = await self.scripts.call(
                    self.redis, "resealTenantSecret", [hash_key], [name, raw, fresh]
                )
                if int(replaced) == 1:
                    sealed += 1
                else:
                    changed += 1
        return ResealReport(sealed, current, changed, sorted(unreadable))


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
