"""The durable history as the engine's payload store (large step outputs).

Why this exists: the engine offloads outputs over ``AIRUNTIME_PAYLOAD_THRESHOLD_BYTES``
through its :class:`~airuntime.engine.payloads.PayloadStore` protocol and must not
import the history; this adapter is what a runtime instance or ``airt run`` injects.
Payloads are content-addressed per owner (tenant, execution, step), so a retried step
that produces the same bytes stores nothing new, and a read names the caller's tenant:
another tenant's payload reads as absent.
"""

from __future__ import annotations

from airuntime.engine.payloads import PayloadOffload
from airuntime.history.errors import HistoryError
from airuntime.history.records import Payload
from airuntime.history.settings import HistorySettings
from airuntime.history.store import HistoryStore

__all__ = ["HistoryPayloads", "payload_offload"]


class HistoryPayloads:
    """:class:`~airuntime.engine.payloads.PayloadStore` over a :class:`HistoryStore`."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store

    async def put(self, tenant_id: str, execution_id: str, step_id: str, data: bytes) -> str:
        return await self.store.put_payload(Payload.of(tenant_id, execution_id, step_id, data))

    async def get(self, payload_id: str, tenant_id: str) -> bytes:
        payload = await self.store.get_payload(payload_id, tenant_id)
        if payload is None:
            raise HistoryError(f"payload {payload_id} not found for tenant {tenant_id!r}")
        return payload.data


def payload_offload(store: HistoryStore, settings: HistorySettings | None = None) -> PayloadOffload:
    """The offload a worker pool takes, with the threshold of ``settings``."""
    threshold = (settings or HistorySettings()).payload_threshold_bytes
    return PayloadOffload(HistoryPayloads(store), threshold)
