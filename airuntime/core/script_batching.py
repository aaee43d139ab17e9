"""Script calls made in the same event-loop turn go to Redis as one pipeline.

Why this exists: a runtime runs many executions at once, and each of them calls its
scripts one at a time (create-and-claim, complete-and-claim, ...). Sent one by one,
every call pays its own socket write, reply read, pool checkout and event-loop wake-up;
on a 2-core machine that per-command overhead, not the Lua, was most of a small run's
cost (``python -m benchmarks.dispatch`` under cProfile: ~8,000 socket sends for 1,000
one-step runs). :class:`ScriptBatcher` does what ioredis calls auto-pipelining: a call
queues itself and the queue is flushed at the end of the current loop turn, so the
calls that many executions made in the same turn share one round trip (a pipeline
without MULTI: each call is still atomic on its own, exactly as a lone EVALSHA is).
The first caller of a queue flushes it; when no other call joined, it sends its call
itself, so a lone call (every step of a chain, a runtime's only run) costs no sending
task.

What a caller sees does not change: its own reply, or its own error raised (a script
error of another call in the batch is not its concern; a connection error reaches every
call of the batch, as it would have reached each one alone). A lost script cache
(NOSCRIPT) is refilled and only the refused calls sent again. A cancelled caller's call
may still run, as an EVALSHA already written to the socket would. On a Redis Cluster
calls go one by one (a pipeline spanning nodes has its own failure modes during
failover and resharding), and a batch never takes more than ``max_batch`` calls (the
chunks of a larger queue go one after the other, so calls keep the order they were
queued in: :meth:`ScriptBatcher.call_in_order`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airuntime.core.redis_client import RedisClient, is_cluster
from airuntime.core.scripts import (
    Arg,
    KeyArg,
    ScriptCall,
    ScriptLibrary,
    library,
    raise_first_error,
)

__all__ = ["ScriptBatcher"]


@dataclass(slots=True)
class _Queued:
    name: str
    keys: Sequence[KeyArg]
    args: Sequence[Arg]
    reply: asyncio.Future[Any] = field(repr=False)


class ScriptBatcher:
    """:meth:`ScriptLibrary.call` of one client, coalesced per event-loop turn."""

    def __init__(
        self, redis: RedisClient, scripts: ScriptLibrary | None = None, *, max_batch: int = 128
    ) -> None:
        self.redis = redis
        self.scripts = scripts or library()
        self.max_batch = max_batch
        self.direct = is_cluster(redis)
        self._queue: list[_Queued] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Round trips that carried more than one call (for tests and benchmarks)."""

    async def call(self, name: str, keys: Sequence[KeyArg], args: Sequence[Arg] = ()) -> Any:
        """The reply of script ``name``, as :meth:`ScriptLibrary.call` returns it."""
        loop = asyncio.get_running_loop()
        if not self._batching(loop):
            return await self.scripts.call(self.redis, name, keys, args)
        script = self.scripts.checked(name, keys)  # a malformed call fails its caller alone
        [queued], leads = self._enqueue(loop, [ScriptCall(name, keys, args)])
        if leads and await self._lead(queued.reply, alone_ok=True):
            # Nobody else called in this loop turn: the call is sent from here, without
            # a sending task and its extra loop turn (a cancel stops this call alone,
            # as it would a lone EVALSHA).
            return await self.scripts.send(self.redis, script, keys, args)
        return await queued.reply

    async def call_in_order(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """:meth:`ScriptLibrary.call_in_order` of ``calls`` (no plain commands): they
        run one after the other in the order given, side by side in the queue so the
        pipeline keeps that order; every call runs, then the first error is raised."""
        loop = asyncio.get_running_loop()
        if not self._batching(loop):
            return await self.scripts.call_in_order(self.redis, calls)
        for c in calls:
            self.scripts.checked(c.name, c.keys)
        queued, leads = self._enqueue(loop, calls)
        if leads:
            await self._lead(queued[0].reply, alone_ok=False)
        replies = await asyncio.gather(*(q.reply for q in queued), return_exceptions=True)
        return raise_first_error(list(replies))

    def _batching(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Calls are queued: not on a cluster, and only on the loop that queued first
        (a client belongs to one loop; another loop's calls go one by one)."""
        return not self.direct and (self._loop is None or self._loop is loop)

    def _enqueue(
        self, loop: asyncio.AbstractEventLoop, calls: Sequence[ScriptCall]
    ) -> tuple[list[_Queued], bool]:
        """Queue ``calls``; True when the queue was empty: the caller leads it
        (:meth:`_lead`)."""
        self._loop = loop
        queued = [_Queued(c.name, c.keys, c.args, loop.create_future()) for c in calls]
        leads = not self._queue
        self._queue.extend(queued)
        return queued, leads

    async def _lead(self, own: asyncio.Future[Any], *, alone_ok: bool) -> bool:
        """The first caller of a queue waits one loop turn, so the calls made in this
        turn join, then sends the queue with a task of its own; True (nothing sent)
        when ``alone_ok`` and the queue holds only the leader's call, which it then
        sends itself. A leader cancelled meanwhile still has the queue sent: the
        others wait for it."""
        try:
            await asyncio.sleep(0)
        except BaseException:
            own.cancel()
            self._flush()
            raise
        if alone_ok and len(self._queue) == 1 and self._queue[0].reply is own:
            self._queue = []
            return True
        self._flush()
        return False

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        if not queue:
            return
        task = asyncio.ensure_future(self._send_all(queue))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_all(self, queue: list[_Queued]) -> None:
        # One chunk after the other: calls queued in an order keep it across chunks.
        for start in range(0, len(queue), self.max_batch):
            await self._send(queue[start : start + self.max_batch])

    async def _send(self, batch: list[_Queued]) -> None:
        if len(batch) == 1:
            one = batch[0]
            try:
                _answer(one, await self.scripts.call(self.redis, one.name, one.keys, one.args))
            except Exception as exc:  # the caller's own error, raised where it awaits
                _answer(one, exc)
            return
        self.batches += 1
        try:
            replies = await self.scripts.call_mixed(
                self.redis, [(q.name, q.keys, q.args) for q in batch]
            )
        except Exception as exc:  # the round trip failed: every call of it learns why
            for queued in batch:
                _answer(queued, exc)
            return
        for queued, reply in zip(batch, replies, strict=True):
            _answer(queued, reply)


def _answer(queued: _Queued, reply: Any) -> None:
    if queued.reply.done():  # its caller was cancelled; the call may have run
        return
    if isinstance(reply, BaseException):
        queued.reply.set_exception(reply)
    else:
        queued.reply.set_result(reply)
