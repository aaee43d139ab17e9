"""A run's timeline and report, computed from its plan, step records and ledger only.

Why this exists: ``GET /v1/runs/{id}/trace`` (a per-step timeline fit for a Gantt
view) and ``GET /v1/runs/{id}/report`` (durations, the critical path, retries,
recoveries, step-slot waits and evidence, model tokens) answer the question "what happened, where
and why did it take this long" -- for a run still hot in Redis and for one in the
archive alike. Both read the execution's material and its ledger (every transition,
stamped with Redis time by its stream id), nothing else.

Ledger entries used (a batch entry, ``steps_claimed`` / ``steps_completed``, read per
step by :func:`~airuntime.engine.ledger_batches.per_step`): ``step_claimed`` (attempt,
worker), ``step_completed``,
``step_retry_scheduled``, ``step_failed``, ``step_recovered`` (an expired claim returned
to Ready: the same attempt runs again), ``step_stopped`` (cancel), ``step_skipped``,
``input_requested``/``input_provided``, ``run_started`` (the instance) and
``step_slots`` (an instance's step-slot admission evidence: admitted, queue_ns, ...).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from airuntime.control_plane.run_ledger import LedgerEntry
from airuntime.control_plane.run_material import ExecutionMaterial
from airuntime.control_plane.run_views import instance_of
from airuntime.engine.handlers.model_call import MODEL_HANDLER
from airuntime.engine.handlers.model_usage import token_count
from airuntime.engine.ledger_batches import BatchEntryError, per_step

__all__ = ["build_report", "build_trace"]

log = logging.getLogger(__name__)

_ENDINGS = {
    "step_completed": "completed",
    "step_retry_scheduled": "retried",
    "step_failed": "failed",
    "step_recovered": "recovered",
    "step_stopped": "stopped",
}


@dataclass(slots=True)
class _Attempt:
    attempt: int
    worker: str
    claimed_at_ms: int
    ended_at_ms: int | None = None
    outcome: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "worker": self.worker,
            "instance_id": instance_of(self.worker),
            "claimed_at_ms": self.claimed_at_ms,
            "ended_at_ms": self.ended_at_ms,
            "outcome": self.outcome,
            "error": self.error,
        }


@dataclass(slots=True)
class _Step:
    attempts: list[_Attempt] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)


def _plan_steps(plan: dict[str, Any]) -> list[dict[str, Any]]:
    steps = plan.get("steps")
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def _replay(ledger: list[LedgerEntry]) -> tuple[dict[str, _Step], list[dict[str, Any]]]:
    """Per-step attempts and marks, and the instances' slot evidence, from the ledger."""
    steps: dict[str, _Step] = {}
    evidence: list[dict[str, Any]] = []
    for e in ledger:
        if e.type == "step_slots":
            evidence.append({"at_ms": e.at_ms, **e.fields})
            continue
        try:
            views = list(per_step(e.type, e.fields))
        except BatchEntryError as exc:
            # Only the platform's scripts write batch entries; a damaged one costs the
            # view its steps' attempts, not the whole trace.
            log.warning(
                "ledger entry %s (seq %d) left out of the trace: %s", e.entry_id, e.seq, exc
            )
            continue
        for kind, fields in views:
            _replay_one(steps, kind, fields, e.at_ms)
    return steps, evidence


def _replay_one(steps: dict[str, _Step], kind: str, fields: dict[str, str], at_ms: int) -> None:
    step = fields.get("step")
    if step is None:
        return
    s = steps.setdefault(step, _Step())
    if kind == "step_claimed":
        attempt = int(fields.get("attempt", "1"))
        s.attempts.append(_Attempt(attempt, fields.get("worker", ""), at_ms))
    elif kind in _ENDINGS and s.attempts and s.attempts[-1].outcome is None:
        last = s.attempts[-1]
        last.ended_at_ms, last.outcome = at_ms, _ENDINGS[kind]
        last.error = fields.get("error")
    elif kind in ("step_skipped", "input_requested", "input_provided"):
        s.marks[kind.removeprefix("step_") + "_at_ms"] = at_ms


def _instances(ledger: list[LedgerEntry]) -> list[str]:
    found: list[str] = []
    for e in ledger:
        inst = e.fields.get("runtime.instance.id")
        if inst and inst not in found:
            found.append(inst)
    return found


def build_trace(ex: ExecutionMaterial, ledger: list[LedgerEntry]) -> dict[str, Any]:
    """The per-step timeline (plan order): each attempt's claim and end, its worker and
    instance, the input wait, the skip; and each instance's step-slot evidence."""
    replayed, evidence = _replay(ledger)
    rows = []
    for spec in _plan_steps(ex.plan):
        sid = str(spec.get("id"))
        record = ex.steps.get(sid, {})
        s = replayed.get(sid, _Step())
        rows.append(
            {
                "step": sid,
                "handler": spec.get("handler"),
                "depends_on": list(spec.get("deps") or []),
                "status": record.get("status"),
                "start_ms": s.attempts[0].claimed_at_ms if s.attempts else None,
                "end_ms": record.get("finished_at_ms"),
                "attempts": [a.to_json() for a in s.attempts],
                **s.marks,
            }
        )
    return {
        "execution_id": ex.execution_id,
        "status": ex.status,
        "created_at_ms": ex.created_at_ms,
        "finished_at_ms": ex.finished_at_ms,
        "instances": _instances(ledger),
        "steps": rows,
        "slot_waits": [
            {"instance_id": ev.get("runtime.instance.id"), "queue_ns": int(ev.get("queue_ns", 0))}
            for ev in evidence
        ],
        "step_slots": evidence,
    }


def _duration(row: dict[str, Any]) -> int:
    start, end = row.get("start_ms"), row.get("end_ms")
    return max(0, end - start) if isinstance(start, int) and isinstance(end, int) else 0


def _critical_path(rows: list[dict[str, Any]]) -> tuple[list[str], int]:
    """The longest chain of dependent steps by duration (rows are in plan order, which
    is topological). Durations are whole milliseconds, so fast steps tie at 0: between
    equal durations the chain with more steps wins, so the path runs to the end of the
    DAG whatever the clock's resolution (a chain a -> b of instant steps is [a, b])."""

    def weight(t: tuple[int, list[str]]) -> tuple[int, int]:
        return t[0], len(t[1])

    best: dict[str, tuple[int, list[str]]] = {}
    for row in rows:
        before = max((best[d] for d in row["depends_on"] if d in best), key=weight, default=(0, []))
        best[row["step"]] = (before[0] + row["duration_ms"], [*before[1], row["step"]])
    total, path = max(best.values(), key=weight, default=(0, []))
    return path, total


def _model_usage(ex: ExecutionMaterial, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calls and tokens of the execution's completed ``model`` steps, per provider and
    model as the provider reported it (what it bills): read from the steps' outputs, so
    an attempt that failed, whose reply was never kept, is not counted."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row["handler"] != MODEL_HANDLER:
            continue
        output = ex.steps.get(row["step"], {}).get("output")
        if not isinstance(output, dict) or not isinstance(output.get("usage"), dict):
            continue
        key = (str(output.get("provider") or "-"), str(output.get("model") or "-"))
        entry = totals.setdefault(
            key,
            {"provider": key[0], "model": key[1], "calls": 0, "input_tokens": 0,
             "output_tokens": 0},
        )  # fmt: skip
        entry["calls"] += 1
        entry["input_tokens"] += token_count(output["usage"].get("input_tokens"))
        entry["output_tokens"] += token_count(output["usage"].get("output_tokens"))
    return [totals[k] for k in sorted(totals)]


def build_report(ex: ExecutionMaterial, ledger: list[LedgerEntry]) -> dict[str, Any]:
    """Durations, the critical path by durations, retries, recoveries, slot waits, the
    step-slot evidence and the model calls' tokens of one execution."""
    trace = build_trace(ex, ledger)
    rows = []
    for row in trace["steps"]:
        outcomes = [a["outcome"] for a in row["attempts"]]
        rows.append(
            {
                "step": row["step"],
                "depends_on": row["depends_on"],
                "status": row["status"],
                "duration_ms": _duration(row),
                "attempts": len(row["attempts"]),
                "retries": outcomes.count("retried"),
                "recoveries": outcomes.count("recovered"),
            }
        )
    path, path_ms = _critical_path(rows)
    wall = (ex.finished_at_ms - ex.created_at_ms) if ex.finished_at_ms is not None else None
    return {
        "execution_id": ex.execution_id,
        "status": ex.status,
        "wall_ms": wall,
        "steps": rows,
        "critical_path": {"steps": path, "duration_ms": path_ms},
        "retries": sum(r["retries"] for r in rows),
        "recoveries": sum(r["recoveries"] for r in rows),
        "slot_wait_ns": sum(w["queue_ns"] for w in trace["slot_waits"]),
        "step_slots": trace["step_slots"],
        "model_usage": _model_usage(ex, trace["steps"]),
    }
