"""How a runtime tells the control plane that a run ended.

Why this module exists: the shared run (control plane) and the run (runtime) are
different records in different hands. When a runtime run reaches a terminal state the
runtime appends a :class:`RunOutcome` to its run bucket's stream (``air:{air}:run-outcomes``
on a standalone server, one per run bucket on a cluster) in the same script that marks
the run finished in the run index, so the outcome exists exactly when the run is
finished. The control plane reads the streams with a consumer
group (acknowledging after it ended the shared run), and a periodic reconciliation of
Dispatched shared runs against the run index covers an outcome it never saw.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from airuntime.fleet.runs import RunStatus

__all__ = ["OUTCOMES_MAXLEN", "RunOutcome"]

OUTCOMES_MAXLEN = 100_000
"""Approximate cap of the outcome stream (entries the control plane has long read)."""


class RunOutcome(BaseModel):
    """A runtime run reached a terminal status."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    shared_run_id: str
    tenant_id: str
    instance_id: str
    status: RunStatus
    execution_id: str | None = None
    reason: str | None = None
    finished_at_ms: int

    def fields(self) -> dict[str, str]:
        """The stream entry (flat strings)."""
        return {k: "" if v is None else str(v) for k, v in self.model_dump(mode="json").items()}

    @classmethod
    def from_fields(cls, fields: dict[Any, Any]) -> RunOutcome:
        def s(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        data: dict[str, str | None] = {s(k): s(v) for k, v in fields.items()}
        for optional in ("execution_id", "reason"):
            if data.get(optional) == "":
                data[optional] = None
        return cls.model_validate(data)
