"""What the durable history keeps of a run, as plain records.

Why this exists: the archiver writes and the resolver reads the same shapes, whichever
database is behind the store. Everything about one finished run that lives in Redis
only until its retention TTL is here: the execution (plan, inputs, context snapshot,
terminal snapshot, step-slot evidence), its ledger (one :class:`ArchivedEvent` per
stream entry), the shared run the control plane kept, and the large step outputs that
Redis holds by reference (:class:`Payload`, :class:`PayloadRef`).

Every record carries the tenant id (events belong to their execution and are read
through it): a read takes the caller's tenant and never returns another tenant's row.
Times are epoch milliseconds, like Redis's. JSON values are decoded Python values
(the store keeps them as JSON text, identical on every backend).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

__all__ = [
    "ArchivedEvent",
    "ArchivedExecution",
    "ArchivedSharedRun",
    "EncodedEvent",
    "EncodedExecution",
    "EventPage",
    "ExecutionRow",
    "JsonObject",
    "LedgerEntry",
    "Payload",
    "PayloadRef",
    "SharedRunPage",
    "payload_id",
]

JsonObject = dict[str, Any]
"""A decoded JSON object."""

PAYLOAD_REF_KEY: Final = "$payload"
"""The key that marks a JSON value as a reference to a stored payload."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_ms(name: str, value: int | None) -> None:
    _require(value is None or (isinstance(value, int) and value >= 0), f"{name}: {value!r}")


def _check_object(name: str, value: object) -> None:
    _require(isinstance(value, dict), f"{name} is a {type(value).__name__}, not a JSON object")


@dataclass(frozen=True, slots=True)
class ArchivedExecution:
    """One finished execution, as archived at finalization."""

    execution_id: str
    tenant_id: str
    pipeline_id: str
    status: str
    created_ms: int
    finished_ms: int | None
    plan: JsonObject
    """The compiled plan (``air:{e:E}:plan``)."""
    inputs: JsonObject
    """The run's inputs."""
    context: JsonObject
    """The ExecutionContextSnapshot the execution ran under."""
    snapshot: JsonObject
    """The terminal snapshot (``air:{e:E}:snapshot``)."""
    step_slots: JsonObject | None = None
    """Step-slot admission evidence of the runtime instance (none for ``airt run``)."""
    run_id: str | None = None
    shared_run_id: str | None = None
    replay_of: str | None = None
    """The execution id of the archived run this one replays, if it is a replay."""
    archived_at_ms: int | None = None
    """When the execution was first archived; set by the store (a re-archive keeps it)."""

    def __post_init__(self) -> None:
        _require(bool(self.execution_id), "execution_id is empty")
        _require(bool(self.tenant_id), f"execution {self.execution_id}: tenant_id is empty")
        _check_ms("created_ms", self.created_ms)
        _check_ms("finished_ms", self.finished_ms)
        _check_ms("archived_at_ms", self.archived_at_ms)
        for name in ("plan", "inputs", "context", "snapshot"):
            _check_object(f"execution {self.execution_id}: {name}", getattr(self, name))
        if self.step_slots is not None:
            _check_object(f"execution {self.execution_id}: step_slots", self.step_slots)


class EncodedExecution(NamedTuple):
    """An execution as the archiver reads it from Redis: its JSON values still the texts
    Redis held (plan, inputs, context, snapshot, step-slot evidence), which the store
    writes as they are. Decoding them only to encode them again was a large part of
    the archiver's CPU per run; :meth:`decoded` is there for whoever wants the values
    (a text that is not a JSON object is refused there, and by every read)."""

    execution_id: str
    tenant_id: str
    pipeline_id: str
    status: str
    created_ms: int
    finished_ms: int | None
    plan_json: str
    inputs_json: str
    context_json: str
    snapshot_json: str
    step_slots_json: str | None = None
    run_id: str | None = None
    shared_run_id: str | None = None

    def decoded(self) -> ArchivedExecution:
        return ArchivedExecution(
            execution_id=self.execution_id,
            tenant_id=self.tenant_id,
            pipeline_id=self.pipeline_id,
            status=self.status,
            created_ms=self.created_ms,
            finished_ms=self.finished_ms,
            plan=json.loads(self.plan_json),
            inputs=json.loads(self.inputs_json),
            context=json.loads(self.context_json),
            snapshot=json.loads(self.snapshot_json),
            step_slots=None if self.step_slots_json is None else json.loads(self.step_slots_json),
            run_id=self.run_id,
            shared_run_id=self.shared_run_id,
        )


ExecutionRow = ArchivedExecution | EncodedExecution
"""What the store writes as one execution row: a decoded record or one still encoded."""


@dataclass(frozen=True, slots=True)
class ArchivedEvent:
    """One entry of an execution's ledger stream (``air:{e:E}:events``)."""

    execution_id: str
    seq: int
    """Position in the ledger (the archiver numbers entries in stream order)."""
    entry_id: str
    """The Redis stream entry id, e.g. ``1718000000000-0``."""
    type: str
    fields: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(
            isinstance(self.seq, int) and self.seq >= 0, f"{self.execution_id}: seq {self.seq!r}"
        )
        _require(
            isinstance(self.fields, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in self.fields.items()),
            f"{self.execution_id}: event {self.seq}: fields are not strings to strings",
        )


class EncodedEvent(NamedTuple):
    """A ledger entry as the archiver reads it from Redis: its fields are still the JSON
    object Redis encoded them as (``captureArchive-1.lua``), which the store writes as
    it is. Decoding every entry only to encode it again was most of the archiver's
    CPU per run; :meth:`decoded` is there for whoever wants the values."""

    execution_id: str
    seq: int
    entry_id: str
    type: str
    fields_json: str

    def decoded(self) -> ArchivedEvent:
        fields = json.loads(self.fields_json)
        return ArchivedEvent(self.execution_id, self.seq, self.entry_id, self.type, fields)


LedgerEntry = ArchivedEvent | EncodedEvent
"""What the store writes as one ledger row: a decoded entry or one still encoded."""


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of an execution's ledger; ``next_after_seq`` is None on the last page."""

    events: list[ArchivedEvent]
    next_after_seq: int | None
    corrupt: list[str] = field(default_factory=list)
    """Rows skipped because they could not be read (each names table and key)."""


@dataclass(frozen=True, slots=True)
class ArchivedSharedRun:
    """One shared run of the control plane, as archived when it ended."""

    shared_run_id: str
    tenant_id: str
    pipeline_id: str
    status: str
    created_ms: int
    finished_ms: int | None
    run: JsonObject
    """The SharedRun JSON (``air:{air}:srun:<SRID>``)."""
    archived_at_ms: int | None = None
    """When the shared run was first archived; set by the store."""

    def __post_init__(self) -> None:
        _require(bool(self.shared_run_id), "shared_run_id is empty")
        _require(bool(self.tenant_id), f"shared run {self.shared_run_id}: tenant_id is empty")
        _check_ms("created_ms", self.created_ms)
        _check_ms("finished_ms", self.finished_ms)
        _check_ms("archived_at_ms", self.archived_at_ms)
        _check_object(f"shared run {self.shared_run_id}: run", self.run)


@dataclass(frozen=True, slots=True)
class SharedRunPage:
    """A page of shared runs, newest first; ``next_cursor`` is None on the last page."""

    runs: list[ArchivedSharedRun]
    next_cursor: str | None
    corrupt: list[str] = field(default_factory=list)
    """Rows skipped because they could not be read (each names table and key)."""


def payload_id(tenant_id: str, execution_id: str, step_id: str, data: bytes) -> str:
    """The content address of a step output: the same bytes of the same step of the
    same execution and tenant always get the same id, so a re-archive is idempotent.

    The owner is part of the address on purpose: two tenants' equal outputs never share
    a row (no cross-tenant existence probe), and removing an execution's payloads never
    breaks another execution's reference.
    """
    digest = hashlib.sha256()
    for part in (tenant_id, execution_id, step_id):
        encoded = part.encode()
        digest.update(len(encoded).to_bytes(4, "big"))
        digest.update(encoded)
    digest.update(data)
    return f"p-{digest.hexdigest()}"


@dataclass(frozen=True, slots=True)
class Payload:
    """A large step output kept in the durable store instead of Redis."""

    payload_id: str
    tenant_id: str
    execution_id: str
    step_id: str
    size: int
    sha256: str
    """Hex SHA-256 of ``data`` (checked on every read)."""
    data: bytes

    @classmethod
    def of(cls, tenant_id: str, execution_id: str, step_id: str, data: bytes) -> Payload:
        return cls(
            payload_id=payload_id(tenant_id, execution_id, step_id, data),
            tenant_id=tenant_id,
            execution_id=execution_id,
            step_id=step_id,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            data=data,
        )

    def problem(self) -> str | None:
        """Why this payload is inconsistent (size, hash, address), or None."""
        if len(self.data) != self.size:
            return f"size {self.size} but {len(self.data)} bytes stored"
        if hashlib.sha256(self.data).hexdigest() != self.sha256:
            return "sha256 does not match the stored bytes"
        if payload_id(self.tenant_id, self.execution_id, self.step_id, self.data) != (
            self.payload_id
        ):
            return "id is not the content address of its owner and bytes"
        return None

    def ref(self) -> PayloadRef:
        return PayloadRef(self.payload_id, self.size, self.sha256)


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """What Redis keeps in place of an output stored as a :class:`Payload`."""

    payload_id: str
    size: int
    sha256: str

    def to_json(self) -> JsonObject:
        return {PAYLOAD_REF_KEY: self.payload_id, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, value: Any) -> PayloadRef | None:
        """The reference a JSON value stands for, or None when it is not one."""
        if not isinstance(value, dict) or not isinstance(value.get(PAYLOAD_REF_KEY), str):
            return None
        size, sha = value.get("size"), value.get("sha256")
        if not isinstance(size, int) or not isinstance(sha, str):
            return None
        return cls(value[PAYLOAD_REF_KEY], size, sha)
