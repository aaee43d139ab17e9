"""Records the history tests archive: plausible executions, ledgers and shared runs."""

from __future__ import annotations

from typing import Any

from airuntime.history import ArchivedEvent, ArchivedExecution, ArchivedSharedRun


def execution(
    execution_id: str = "e-1", tenant_id: str = "tenant-a", **fields: Any
) -> ArchivedExecution:
    values: dict[str, Any] = {
        "execution_id": execution_id,
        "tenant_id": tenant_id,
        "run_id": f"run-{execution_id}",
        "shared_run_id": f"sr-{execution_id}",
        "pipeline_id": "summarize-documents",
        "status": "Succeeded",
        "created_ms": 1_700_000_000_000,
        "finished_ms": 1_700_000_005_000,
        "plan": {"id": "summarize-documents", "steps": [{"id": "split"}, {"id": "join"}]},
        "inputs": {"doc": "héllo ✓", "n": 3},
        "context": {"tenant_id": tenant_id, "user": "u1", "namespaces": ["a", "b"]},
        "snapshot": {"status": "Succeeded", "steps": {"split": {"output": [1, 2.5, None]}}},
        "step_slots": {"admitted": 2, "succeeded": 2, "queue_ms": 1.5},
        "replay_of": None,
    }
    values.update(fields)
    return ArchivedExecution(**values)


def events(
    execution_id: str = "e-1", count: int = 5, *, kind: str = "claim"
) -> list[ArchivedEvent]:
    return [
        ArchivedEvent(
            execution_id=execution_id,
            seq=seq,
            entry_id=f"{1_700_000_000_000 + seq}-0",
            type=kind,
            fields={"step": f"s{seq}", "worker": "w-1"},
        )
        for seq in range(count)
    ]


def shared_run(
    shared_run_id: str,
    tenant_id: str = "tenant-a",
    *,
    created_ms: int = 1_700_000_000_000,
    status: str = "Succeeded",
    pipeline_id: str = "summarize-documents",
) -> ArchivedSharedRun:
    return ArchivedSharedRun(
        shared_run_id=shared_run_id,
        tenant_id=tenant_id,
        pipeline_id=pipeline_id,
        status=status,
        created_ms=created_ms,
        finished_ms=created_ms + 1000,
        run={"shared_run_id": shared_run_id, "tenant": tenant_id, "status": status},
    )


def without_archived_at(record: Any) -> Any:
    """The record as written (the store sets ``archived_at_ms``)."""
    from dataclasses import replace

    return replace(record, archived_at_ms=None)
