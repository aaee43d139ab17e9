"""Large step outputs live in a durable payload store; Redis keeps a reference.

Why this exists: a step output of megabytes held in Redis costs memory on every replica
for the whole retention window, and is copied into every dependent's claim reply. Over
a threshold (``AIRUNTIME_PAYLOAD_THRESHOLD_BYTES``, 64 KiB) the worker writes the
output to a :class:`PayloadStore` *before* the completion script runs, and the
completion records ``{"$payload": id, "size": n, "sha256": hex}`` instead; the
terminal snapshot keeps that reference. Dependents' handlers never see it: references
in a claim's outputs are resolved (and cached per worker pool) where a step's inputs are
built.

The engine does not know where payloads live: the durable history implements
:class:`PayloadStore` (``airuntime.history.payloads``) and the process that builds the
worker pool (runtime instance, ``airt run``) injects it.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, Protocol

__all__ = ["PAYLOAD_REF_KEY", "PayloadOffload", "PayloadStore", "is_payload_ref"]

PAYLOAD_REF_KEY: Final = "$payload"
"""The key that marks a JSON value as a reference to a stored payload."""

UNOWNED_TENANT: Final = "default"


def is_payload_ref(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get(PAYLOAD_REF_KEY), str)
        and isinstance(value.get("size"), int)
        and isinstance(value.get("sha256"), str)
    )


class PayloadStore(Protocol):
    """Where large outputs are kept (implemented by the durable history)."""

    async def put(self, tenant_id: str, execution_id: str, step_id: str, data: bytes) -> str:
        """Store ``data`` (idempotent); returns the payload id."""
        ...

    async def get(self, payload_id: str, tenant_id: str) -> bytes:
        """The stored bytes (checked against their hash); raises when absent."""
        ...


class PayloadOffload:
    """A worker pool's side of offloading: write big outputs, resolve references."""

    def __init__(
        self, store: PayloadStore, threshold_bytes: int, *, cache_bytes: int = 64 << 20
    ) -> None:
        self.store = store
        self.threshold_bytes = threshold_bytes
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, tuple[int, Any]] = OrderedDict()
        self._cached = 0
        self.offloaded = 0
        self.fetched = 0

    async def offload(self, tenant_id: str, execution_id: str, step_id: str, text: str) -> str:
        """The output JSON Redis should keep: ``text``, or a reference to it."""
        data = text.encode()
        if len(data) <= self.threshold_bytes:
            return text
        tenant = tenant_id or UNOWNED_TENANT
        payload_id = await self.store.put(tenant, execution_id, step_id, data)
        self.offloaded += 1
        self._remember(payload_id, len(data), json.loads(text))
        ref = {PAYLOAD_REF_KEY: payload_id, "size": len(data)}
        ref["sha256"] = hashlib.sha256(data).hexdigest()
        return json.dumps(ref, separators=(",", ":"), sort_keys=True)

    async def resolve(self, outputs: Mapping[str, Any], tenant_id: str) -> dict[str, Any]:
        """``outputs`` with every top-level payload reference replaced by its value."""
        resolved: dict[str, Any] = {}
        for step, value in outputs.items():
            resolved[step] = await self._value(value, tenant_id) if is_payload_ref(value) else value
        return resolved

    async def _value(self, ref: dict[str, Any], tenant_id: str) -> Any:
        payload_id = ref[PAYLOAD_REF_KEY]
        hit = self._cache.get(payload_id)
        if hit is not None:
            self._cache.move_to_end(payload_id)
            return hit[1]
        data = await self.store.get(payload_id, tenant_id or UNOWNED_TENANT)
        self.fetched += 1
        value = json.loads(data)
        self._remember(payload_id, len(data), value)
        return value

    def _remember(self, payload_id: str, size: int, value: Any) -> None:
        if size > self.cache_bytes or payload_id in self._cache:
            return
        self._cache[payload_id] = (size, value)
        self._cached += size
        while self._cached > self.cache_bytes:
            _, (old, _) = self._cache.popitem(last=False)
            self._cached -= old
