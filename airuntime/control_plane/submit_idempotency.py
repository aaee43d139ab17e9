"""Submitting with an idempotency key: a request sent again is the same run.

Why this exists: a client whose ``POST /v1/runs`` timed out, lost its connection or
got a 503 cannot know whether the run was created (a server that wrote the record and
then lost the connection, a Valkey that ran the script and then froze). Sent again, it
made a second run -- one submission, executed twice. With an ``Idempotency-Key``
header (the IETF draft's name; ``idempotency_key`` in MCP's ``submit_run``, ``airt
submit --idempotency-key``), the control plane keeps, per tenant, which run the key
created, in the same script that creates the run (``submitSharedRun-7.lua``), for
``AIRUNTIME_IDEMPOTENCY_TTL_S`` (default 24 h):

* the same key again with the same request answers with that run (still 202, and
  ``Idempotent-Replayed: true``), whatever became of it, and creates nothing;
* the same key with another request (another pipeline, inputs, metadata, mode or
  context) is refused, 409, naming the run it created: a key is one request;
* two submissions with one key at the same moment make one run: the script that
  creates a run sets the key, and the other finds it set.

Keys are the tenant's own (the tenant is part of the key's name): another tenant's
equal key is another key. A key is 1 to 255 visible ASCII characters.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot

if TYPE_CHECKING:
    from airuntime.control_plane.shared_runs import SharedRun

__all__ = [
    "IDEMPOTENCY_KEY_PATTERN",
    "Submission",
    "SubmitIdempotency",
    "request_fingerprint",
]

IDEMPOTENCY_KEY_PATTERN: Final = r"^[\x21-\x7e]{1,255}$"
"""1 to 255 visible ASCII characters (no space, no control character)."""


def request_fingerprint(
    pipeline: dict[str, Any],
    snapshot: ExecutionContextSnapshot,
    *,
    inputs: dict[str, Any] | None,
    metadata: dict[str, str] | None,
    mode: str | None,
    replay_of: str | None,
) -> str:
    """What makes two submissions the same request: a SHA-256 of their canonical JSON
    (keys sorted: the order a client wrote them in does not matter)."""
    document = {
        "pipeline": pipeline,
        "snapshot": snapshot.model_dump(mode="json"),
        "inputs": inputs or {},
        "metadata": metadata or {},
        "mode": mode,
        "replay_of": replay_of,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class SubmitIdempotency:
    """A submission's idempotency key as the submit script keeps it: the key's name,
    how long it is kept, and the request's fingerprint (what a later use must match);
    ``given``: the key as the client sent it (for messages)."""

    key: str
    ttl_ms: int
    fingerprint: str
    given: str

    @classmethod
    def of(
        cls, tenant_id: str, idempotency_key: str, ttl_s: float, fingerprint: str
    ) -> SubmitIdempotency:
        key = keys.submit_idempotency(tenant_id, idempotency_key)
        return cls(key, int(ttl_s * 1000), fingerprint, idempotency_key)

    def value(self, shared_run_id: str) -> str:
        """What the key holds once it created ``shared_run_id``."""
        return f"{shared_run_id} {self.fingerprint}"

    @staticmethod
    def parse(value: bytes | str) -> tuple[str, str]:
        """``(SharedRunId, fingerprint)`` of a stored value."""
        text = value.decode() if isinstance(value, bytes) else value
        shared_run_id, _, fingerprint = text.partition(" ")
        return shared_run_id, fingerprint


@dataclass(frozen=True)
class Submission:
    """What a submit made: the run (None when a replayed key's run is no longer in
    Redis: read it from the archive by ``shared_run_id``), and whether the key named an
    earlier submission (nothing was created)."""

    shared_run_id: str
    run: SharedRun | None
    replayed: bool = False
