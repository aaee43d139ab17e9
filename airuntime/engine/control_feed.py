"""A worker pool's one subscription to the control channel, kept alive across outages.

Why this exists: a cancel must reach steps that are running *now*, in whichever
processes run them, without every participation polling Redis in a tight loop.
``controlExecution`` PUBLISHes the execution id on :func:`~airuntime.core.keys.control_channel`
for every pause, resume and cancel; each :class:`~airuntime.engine.worker_pool.WorkerPool`
holds one :class:`ControlFeed` (not one per execution) and hands each notice to the
participations of that execution, which read the control state and act.

Pub/sub delivers at most once and nothing while disconnected, so the feed is a
supervised loop (:class:`~airuntime.core.supervision.Supervisor`): a dropped connection
ends the subscription, the supervisor subscribes again after a jittered backoff, and
every (re)subscription announces ``None`` -- "anything may have been missed, check
every execution". Participations also learn the control state from their claim and
completion replies and from a slow periodic read, so a notice lost in between delays
a cancel, it never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from redis.asyncio import RedisCluster

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.supervision import Backoff, LoopContext, Supervisor

__all__ = ["ControlFeed", "Notice"]

Notice = Callable[[str | None], None]
"""Called with the execution id of a control change, or None after (re)subscribing."""


class ControlFeed:
    """Subscribe to the control channel and report each notice (see module doc)."""

    def __init__(self, redis: RedisClient, notice: Notice, *, owner: str, backoff: Backoff) -> None:
        self._redis = redis
        self._notice = notice
        self._supervisor = Supervisor(f"control-feed:{owner}", backoff=backoff)
        self._changed = asyncio.Event()
        self.subscriptions = 0
        """How many times the feed (re)subscribed (a new subscription, or the client's
        own reconnect of the subscribed connection)."""

    def start(self) -> None:
        self._supervisor.start("subscription", self._listen)

    async def stop(self) -> None:
        await self._supervisor.stop()

    async def wait_subscriptions(self, count: int) -> None:
        """Return once the feed has (re)subscribed ``count`` times in all."""
        while self.subscriptions < count:
            self._changed.clear()
            await self._changed.wait()

    @property
    def healthy(self) -> bool:
        return not self._supervisor.unhealthy()

    def _subscribed(self) -> None:
        self.subscriptions += 1
        self._changed.set()
        self._notice(None)  # notices sent while unsubscribed are lost: check everything

    async def _reconnected(self, connection: Any) -> None:
        # redis-py reconnects a pub/sub connection by itself (and subscribes again
        # before this callback runs): the gap may have swallowed a notice.
        self._subscribed()

    async def _listen(self, ctx: LoopContext) -> None:
        if isinstance(self._redis, RedisCluster):
            # A cluster client learns the slot map on its first command; a pub/sub
            # connection opened before that is closed under the subscription by the
            # client's own initialization (and may take a command's connection with it).
            await self._redis.initialize()
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        connection: Any = None
        try:
            await pubsub.subscribe(keys.control_channel())
            connection = pubsub.connection
            connection.register_connect_callback(self._reconnected)
            ctx.ok()
            self._subscribed()
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    data = message["data"]
                    self._notice(data.decode() if isinstance(data, bytes) else str(data))
        finally:
            if connection is not None:
                connection.deregister_connect_callback(self._reconnected)
            with contextlib.suppress(Exception):
                await pubsub.aclose()
