"""Status helpers: RFC 3339 timestamps and ``metav1.Condition`` lists.

Why a module: both resources report time stamps and conditions the way every
Kubernetes controller does (``lastTransitionTime`` only moves when ``status``
flips), and the rules for that belong in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from airuntime.k8s.v1alpha1 import ConditionStatus

__all__ = ["find_condition", "format_time", "is_true", "now", "parse_time", "with_condition"]


def now() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def find_condition(
    conditions: Sequence[Mapping[str, Any]] | None, type_: str
) -> Mapping[str, Any] | None:
    """The condition of type ``type_``, if ``conditions`` has one."""
    return next((c for c in conditions or () if c.get("type") == type_), None)


def is_true(condition: Mapping[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == ConditionStatus.TRUE


def with_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    at: datetime | None = None,
) -> list[dict[str, Any]]:
    """``conditions`` with ``type_`` set; its transition time is kept unless it flips."""
    status_text = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    out: list[dict[str, Any]] = []
    previous: Mapping[str, Any] | None = None
    for condition in conditions or ():
        if condition.get("type") == type_:
            previous = condition
        else:
            out.append(dict(condition))
    transition = (
        str(previous["lastTransitionTime"])
        if previous is not None
        and previous.get("status") == status_text
        and previous.get("lastTransitionTime")
        else format_time(at or now())
    )
    updated: dict[str, Any] = {
        "type": str(type_),
        "status": status_text.value,
        "reason": str(reason),
        "message": message[:32768],
        "lastTransitionTime": transition,
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    out.append(updated)
    return sorted(out, key=lambda c: str(c.get("type")))
