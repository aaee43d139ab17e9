"""The tenant settings a control plane compiles submitted pipelines against, kept between submits.

Why this exists: every submit compiles the pipeline against its tenant's handler
allowlist, and reading the settings for each one was a round trip of its own: a
quarter of a streamed run's round trips and about a fifth of the control plane's CPU a
run (``python -m benchmarks.dispatch --scenarios streaming``: 1,310 -> 1,640 runs/s
with the read gone). Settings change rarely, so a control plane keeps the last text it
read per tenant. A kept entry never decides on its own: the script that creates the
shared run (``submitSharedRun-7.lua``) compares the stored settings with the text the
pipeline was compiled against, byte for byte, and writes nothing when they differ;
the submitter then forgets the entry, reads the settings again and compiles again; and
a pipeline the kept settings refuse is compiled again against freshly read ones before
the refusal is given. So a change made anywhere (another control plane, ``airt``, the
API) holds from the very next submit, both ways. At most ``capacity`` tenants are
kept, least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import TenantSettings

__all__ = ["KnownSettings", "TenantSettingsCache"]


@dataclass(frozen=True, slots=True)
class KnownSettings:
    """A tenant's settings and the stored text they were read from (``b""``: none
    stored, the Shared defaults)."""

    settings: TenantSettings
    text: bytes


class TenantSettingsCache:
    """The last settings read per tenant (see the module doc)."""

    def __init__(self, registry: Registry, *, capacity: int = 1024) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.registry = registry
        self.capacity = capacity
        self._known: OrderedDict[str, KnownSettings] = OrderedDict()
        self.reads = 0
        """Settings read from Redis (for tests and benchmarks)."""

    async def get(self, tenant_id: str) -> tuple[KnownSettings, bool]:
        """The settings last read for ``tenant_id`` (read now if none are kept), and
        whether they were kept from before: a decision against kept settings that the
        creating script does not check (a refusal) is made again on fresh ones."""
        known = self._known.get(tenant_id)
        if known is not None:
            self._known.move_to_end(tenant_id)
            return known, True
        settings, text = await self.registry.tenant_with_text(tenant_id)
        self.reads += 1
        known = KnownSettings(settings, text)
        self._known[tenant_id] = known
        if len(self._known) > self.capacity:
            self._known.popitem(last=False)
        return known, False

    def forget(self, tenant_id: str) -> None:
        """Read ``tenant_id``'s settings again next time (they changed)."""
        self._known.pop(tenant_id, None)
