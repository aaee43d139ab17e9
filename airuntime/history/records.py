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
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "ArchivedEvent",
    "ArchivedExecution",
    "ArchivedSharedRun",
    "EventPage",
    "JsonObject",
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
    encoded: dict[str, str] | None = field(default=None, init=False, compare=False, repr=False)
    """The JSON texts ``plan``, ``inputs``, ``context`` and ``snapshot`` were decoded
    from (keys: those names), when the reader had them: the store writes them as they
    are instead of encoding the values again. Set only by :meth:`with_encoded`; not an
    ``__init__`` argument, so ``dataclasses.replace`` never carries stale texts over."""

    def with_encoded(self, texts: dict[str, str]) -> ArchivedExecution:
        """This record, knowing the JSON texts its values were decoded from."""
        object.__setattr__(self, "encoded", texts)
        return self

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
    fields_json: str | None = field(default=None, compare=False, repr=False)
    """``fields`` as the JSON text they were decoded from, when the reader had it (the
    store writes it as is instead of encoding ``fields`` again)."""

    @classmethod
    def from_stream(
        cls,
        execution_id: str,
        seq: int,
        entry_id: str,
        fields: dict[str, str],
        fields_json: str | None = None,
    ) -> ArchivedEvent:
        """An entry as the archiver read it from the ledger stream: ``seq`` is its
        position and ``fields`` were decoded from Redis (or from ``fields_json``, the
        JSON object Redis encoded them as), strings by construction, so the checks of
        ``__post_init__`` (a few µs per entry, on every ledger row archived) are not
        repeated."""
        event = object.__new__(cls)
        for name, value in (
            ("execution_id", execution_id),
            ("seq", seq),
            ("entry_id", entry_id),
            ("type", fields.get("type", "")),
            ("fields", fields),
            ("fields_json", fields_json),
        ):
            object.__setattr__(event, name, value)
        return event

    def __post_init__(self) -> None:
        _require(
            isinstance(self.seq, int) and self.seq >= 0, f"{self.execution_id}: seq {self.seq!r}"
        )
        _require(
            isinstance(self.fields, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in self.fields.items()),
            f"{self.execution_id}: event {self.seq}: fields are not strings to strings",
        )


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
