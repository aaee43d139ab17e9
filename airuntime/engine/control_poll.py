"""A worker pool's one periodic read of the control state of what it is running.

Why this exists: the control channel (:mod:`~airuntime.engine.control_feed`) delivers at
most once, so a cancel whose notice was lost must still reach running steps. The
fallback is a read of each execution's status and control field every
``control_poll_ms`` while steps of it run. Done per participation, that is one round
trip per running execution per period: a pool running 200 executions of long steps
would read Redis 1,000 times a second for nothing. Done here, it is one pipelined
round trip per period for all of them, whatever their number.

The poll is a supervised loop (:class:`~airuntime.core.supervision.Supervisor`): a
failed read (Redis away) is logged and retried after a jittered backoff, and the
replies and notices the participations receive meanwhile still carry the state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from airuntime.core.supervision import Backoff, LoopContext, Supervisor

if TYPE_CHECKING:
    from airuntime.engine.execution_store import ExecutionStore
    from airuntime.engine.participation import Participation

__all__ = ["ControlPoll"]


class ControlPoll:
    """Every ``every_s``, read the control state of each execution whose steps run in
    ``watched()`` and hand it to those participations (see module doc)."""

    def __init__(
        self,
        store: ExecutionStore,
        watched: Callable[[], Iterable[Participation]],
        *,
        every_s: float,
        owner: str,
        backoff: Backoff,
    ) -> None:
        self._store = store
        self._watched = watched
        self._every_s = every_s
        self._supervisor = Supervisor(f"control-poll:{owner}", backoff=backoff)
        self.rounds = 0
        """Reads made (one round trip each)."""

    def start(self) -> None:
        self._supervisor.start("poll", self._poll)

    async def stop(self) -> None:
        await self._supervisor.stop()

    async def _poll(self, ctx: LoopContext) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            watched = [p for p in self._watched() if p.running and not p.cancelling]
            if watched:
                states = await self._store.control_states(sorted({p.eid for p in watched}))
                self.rounds += 1
                for participation in watched:
                    state = states.get(participation.eid)
                    if state is not None:  # gone (retention): its participation ends anyway
                        participation.apply_control(state)
            ctx.ok()
