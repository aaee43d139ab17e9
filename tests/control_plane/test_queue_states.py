"""The named states of queue items and shared runs match what really writes them.

The shared-queue Lua scripts write the ``status`` of a queue item; Python names those
values once (:class:`QueueItemStatus`) with the moves between them
(:data:`QUEUE_ITEM_TRANSITIONS`). Here every status literal of the scripts must be a
member, every member must be written by some script, and the moves the scripts make
on a real server must be exactly the table's.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import TypeVar

from redis.asyncio import Redis

from airuntime.control_plane.shared_queue import (
    QUEUE_ITEM_TRANSITIONS,
    QueueItemStatus,
    SharedQueue,
)
from airuntime.control_plane.shared_runs import SHARED_RUN_TRANSITIONS, SharedRunStatus
from airuntime.core.scripts import LUA_DIR, load_script

QUEUE_SCRIPTS = sorted(LUA_DIR.glob("*SharedRun*.lua"))
WRITES = re.compile(r"'status',\s*'(\w+)'")
COMPARES = re.compile(r"status'?\)?\s*[~=]=\s*'(\w+)'|outcome\s*[~=]=\s*'(\w+)'")
T = TypeVar("T")
SETTLE_OUTCOMES = re.compile(r"outcome:\s*(\w+(?:\s*\|\s*\w+)*)")


def _code(text: str) -> str:
    """The script without its header comment (which documents, and may name anything)."""
    return re.sub(r"--\[\[.*?\]\]", "", text, flags=re.S)


def _settle_outcomes() -> set[str]:
    header = (LUA_DIR / "settleSharedRun-2.lua").read_text()
    found = SETTLE_OUTCOMES.search(header)
    assert found is not None, "settleSharedRun documents its outcomes"
    return {o.strip() for o in found.group(1).split("|")}


def test_every_status_literal_of_the_queue_scripts_is_a_queue_item_status() -> None:
    assert {p.name for p in QUEUE_SCRIPTS} >= {
        "enqueueSharedRun-2.lua",
        "claimSharedRun-2.lua",
        "claimSharedRunById-2.lua",
        "settleSharedRun-2.lua",
        "cancelSharedRun-2.lua",
    }
    members = {s.value for s in QueueItemStatus}
    written: set[str] = set()
    for path in QUEUE_SCRIPTS:
        code = _code(load_script(path).source)  # with its includes expanded
        literals = set(WRITES.findall(code))
        literals |= {a or b for a, b in COMPARES.findall(code)}
        assert literals <= members, f"{path.name}: {sorted(literals - members)}"
        written |= set(WRITES.findall(code))
    outcomes = _settle_outcomes()
    assert outcomes == set(QUEUE_ITEM_TRANSITIONS[QueueItemStatus.CLAIMED])
    assert written | outcomes == members, "every member is written by some script"


def test_both_transition_tables_cover_every_status() -> None:
    assert set(QUEUE_ITEM_TRANSITIONS) == set(QueueItemStatus)
    assert set(SHARED_RUN_TRANSITIONS) == set(SharedRunStatus)
    assert SharedRunStatus.QUEUED_GLOBALLY.can_become(SharedRunStatus.DISPATCHED)
    assert SharedRunStatus.CANCELLED.can_become(SharedRunStatus.CANCELLED)
    assert not SharedRunStatus.CANCELLED.can_become(SharedRunStatus.QUEUED_GLOBALLY)
    assert SharedRunStatus.DISPATCHED.can_become(SharedRunStatus.CANCELLED)
    assert SharedRunStatus.DISPATCHED.can_become(SharedRunStatus.SUCCEEDED)
    for status in SharedRunStatus:
        if status.terminal and status is not SharedRunStatus.REJECTED:
            assert SHARED_RUN_TRANSITIONS[status] == frozenset(), f"{status} is final"


async def test_the_scripts_move_items_exactly_along_the_table(redis: Redis) -> None:
    queue = SharedQueue(redis)
    moves: set[tuple[QueueItemStatus, QueueItemStatus]] = set()
    S = QueueItemStatus

    async def do(srid: str, op: Awaitable[T]) -> T:
        before = await queue.status(srid, "default")
        result = await op
        after = await queue.status(srid, "default")
        if before is not None and after is not None and after is not before:
            moves.add((before, after))
        return result

    async def claim_and_settle(srid: str, outcome: QueueItemStatus) -> None:
        item = await do(srid, queue.claim("pump", srid, "default"))
        assert item is not None, srid
        assert await do(srid, queue.settle(item, outcome, "test"))

    for srid in ("a", "b", "c", "d"):
        await queue.enqueue(srid, "default")
        assert await queue.status(srid, "default") is S.PENDING

    # a: back to Pending, Dispatched (not cancellable), requeued, cancelled, requeued
    await claim_and_settle("a", S.PENDING)
    await claim_and_settle("a", S.DISPATCHED)
    assert await do("a", queue.cancel("a", "default")) == 0
    await do("a", queue.enqueue("a", "default", requeue=True))
    await do("a", queue.cancel("a", "default"))
    await do("a", queue.enqueue("a", "default", requeue=True))
    # b: parked (ScaleOutRequested, Rejected), requeued only on request, cancelled parked
    await claim_and_settle("b", S.SCALE_OUT_REQUESTED)
    assert await do("b", queue.enqueue("b", "default")) is False
    await do("b", queue.enqueue("b", "default", requeue=True))
    await claim_and_settle("b", S.REJECTED)
    await do("b", queue.enqueue("b", "default", requeue=True))
    await claim_and_settle("b", S.SCALE_OUT_REQUESTED)
    await do("b", queue.cancel("b", "default"))
    # c: cancelled while Rejected; d: cancelled while Claimed, then its settle is refused
    await claim_and_settle("c", S.REJECTED)
    await do("c", queue.cancel("c", "default"))
    claimed = await do("d", queue.claim("pump", "d", "default"))
    assert claimed is not None
    await do("d", queue.cancel("d", "default"))
    assert await do("d", queue.settle(claimed, S.DISPATCHED)) is False

    table = {(a, b) for a, nexts in QUEUE_ITEM_TRANSITIONS.items() for b in nexts}
    assert moves == table


async def test_pending_items_are_listed_oldest_first_per_tenant(redis: Redis) -> None:
    queue = SharedQueue(redis)
    ids = [f"sr-{i:032x}" for i in range(5)]
    tenants = ["tenant-a", "tenant-b", "tenant-a", "tenant-b", "tenant-a"]
    for srid, tenant in zip(ids, tenants, strict=True):
        assert await queue.enqueue(srid, tenant)
    claimed = await queue.claim("pump-1", ids[2], "tenant-a")
    assert claimed is not None, "a claimed item is no longer pending"
    everyone = await queue.pending_items(None)
    assert [i.shared_run_id for i in everyone] == [ids[0], ids[1], ids[3], ids[4]]
    assert [i.enqueued_at_ms for i in everyone] == sorted(i.enqueued_at_ms for i in everyone)
    assert all(i.enqueued_at_ms > 0 for i in everyone)
    mine = await queue.pending_items("tenant-a")
    assert [(i.shared_run_id, i.tenant_id) for i in mine] == [
        (ids[0], "tenant-a"),
        (ids[4], "tenant-a"),
    ]
    assert await queue.pending_items("tenant-c") == []
