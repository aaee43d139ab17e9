"""Batch ledger entries, and the per-step reading of them.

Why this exists: a claim or completion batch of N steps used to append N ledger entries,
one ``XADD`` each, and those appends were about a fifth of the Redis CPU of a no-op step
of a fan-out. The batch scripts (``includes/claimReady.lua``, ``completeSteps``) now
append one entry per batch instead:

* ``steps_claimed``: ``worker`` (the claiming pool), ``steps``, ``attempts``, ``tokens``;
* ``steps_completed``: ``steps``, ``attempts``, ``workers``, ``tokens``;

where a plural field is a JSON array aligned by index with ``steps``. Nothing is lost:
each step of the batch has exactly the fields a per-step ``step_claimed`` /
``step_completed`` entry has, stamped with the batch entry's id (Redis time). A single
claim of a throttled step (``claimStep``) still writes a per-step ``step_claimed`` (with
its concurrency lease).

Readers that reason per step -- the step-status replay, the run trace, the engine's
own :meth:`~airuntime.engine.execution_store.ExecutionStore.events` and the tests --
read the ledger through :func:`per_step`, which turns a batch entry into one
``step_claimed`` / ``step_completed`` view per step in the batch's order and passes
every other entry through unchanged. The ledger API (``GET /v1/runs/{id}/events``) and
the archive keep the entries as written, so their ``seq`` and cursors still count
stream entries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Final

__all__ = ["BATCH_TYPES", "LIST_FIELDS", "BatchEntryError", "per_step"]

BATCH_TYPES: Final = {"steps_claimed": "step_claimed", "steps_completed": "step_completed"}
"""A batch entry's type -> the type of each of its per-step views."""

LIST_FIELDS: Final = {
    "steps": "step",
    "attempts": "attempt",
    "workers": "worker",
    "tokens": "token",
}
"""A batch entry's list fields -> the per-step field each element becomes."""


class BatchEntryError(ValueError):
    """A batch entry whose lists are not JSON arrays of strings of one length."""


def per_step(entry_type: str, fields: Mapping[str, str]) -> Iterator[tuple[str, dict[str, str]]]:
    """``(type, fields)`` per step of a batch entry; any other entry as it is.

    ``fields`` may hold ``type`` (it is replaced by the per-step type when present);
    scalar fields of a batch entry (``worker`` of a claim batch) are copied to each step.
    """
    step_type = BATCH_TYPES.get(entry_type)
    if step_type is None:
        yield entry_type, dict(fields)
        return
    lists: dict[str, list[str]] = {}
    common: dict[str, str] = {}
    for name, value in fields.items():
        single = LIST_FIELDS.get(name)
        if single is None:
            common[name] = value
            continue
        try:
            items = json.loads(value)
        except ValueError as exc:
            raise BatchEntryError(f"{entry_type}: field {name!r} is not JSON: {value!r}") from exc
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise BatchEntryError(f"{entry_type}: field {name!r} is not a list of strings")
        lists[single] = items
    steps = lists.get("step")
    if steps is None:
        raise BatchEntryError(f"{entry_type}: no 'steps' field")
    for single, items in lists.items():
        if len(items) != len(steps):
            raise BatchEntryError(
                f"{entry_type}: {len(items)} {single} values for {len(steps)} steps"
            )
    if "type" in common:
        common["type"] = step_type
    for i in range(len(steps)):
        view = dict(common)
        for single, items in lists.items():
            view[single] = items[i]
        yield step_type, view
