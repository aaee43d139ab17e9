"""The ``redis`` provider's side on a runtime instance: its stream inbox.

Why this module exists: a run request delivered through Redis must be answered once
it was read, even when the instance loses Redis (or dies) between reading and
answering. The reader is a consumer of the group ``runtime`` on
``air:instance:<id>:inbox``; an entry is acknowledged and deleted only after its
answer was pushed to the sender's reply list. On every (re)start the reader first
re-reads the entries its consumer read but never acknowledged (``XREADGROUP`` from
id ``0``) and claims the ones a dead consumer of the same instance (an earlier
process under the same id) left idle for a registration TTL (``XAUTOCLAIM``, again
every registration TTL while it reads); answering twice is harmless because
accepting is idempotent by SharedRunId.

The stream lives as long as its instance: a TTL of ten registration TTLs, refreshed
every heartbeat; deleted on a graceful stop. Providers never create it
(``XADD NOMKSTREAM``), so a dead instance's inbox expires and is not recreated.
Blocking reads block in slices shorter than the client's socket timeout
(:mod:`airuntime.fleet.blocking`).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from airuntime.core import keys
from airuntime.core.errors import AirError
from airuntime.core.slots import ensure_transaction_slot
from airuntime.core.supervision import LoopContext
from airuntime.core.transient import TRANSIENT_ERRORS
from airuntime.fleet.blocking import block_slice_s, unless_unblocked
from runtime_pod.intake import RunRefused

if TYPE_CHECKING:
    from runtime_pod.instance import RuntimeInstance

__all__ = ["GROUP", "REPLY_TTL_S", "Inbox"]

log = logging.getLogger(__name__)

GROUP = "runtime"
REPLY_TTL_S = 300
"""A reply list outlives any provider's wait for it, then expires."""
_BATCH = 32
_BLOCK_S = 1.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusal(exc: AirError) -> dict[str, Any]:
    """The answer that refuses a request (the provider raises it as a DeliveryError)."""
    return {"error": str(exc), "reason": exc.reason if isinstance(exc, RunRefused) else "refused"}


class Inbox:
    """Reads, answers and acknowledges the run requests of one instance's inbox."""

    def __init__(self, instance: RuntimeInstance) -> None:
        self.inst = instance
        self.redis = instance.redis
        self.stream = keys.instance_inbox(instance.instance_id)
        self.consumer = f"{instance.instance_id}@{socket.gethostname()}"

    @property
    def ttl_ms(self) -> int:
        return self.inst.config.heartbeat_ttl_ms * 10

    async def run(self, ctx: LoopContext) -> None:
        """The supervised loop: recover what an earlier reader left, then read."""
        await self.ensure()
        await self._reread_own_pending()
        await self._claim_abandoned()
        ctx.ok()
        block_ms = int(block_slice_s(self.redis, _BLOCK_S) * 1000)
        claim_every_s = self.inst.config.heartbeat_ttl_ms / 1000
        last_claim = time.monotonic()
        while True:
            reply: Any = await unless_unblocked(
                lambda: self.redis.xreadgroup(
                    GROUP, self.consumer, {self.stream: ">"}, count=_BATCH, block=block_ms
                ),
                f"inbox read on {self.stream}",
            )
            for _, entries in reply or []:
                await self._handle_batch(entries)
            if time.monotonic() - last_claim >= claim_every_s:
                await self._claim_abandoned()  # a consumer that died after our start
                last_claim = time.monotonic()
            ctx.ok()

    async def ensure(self) -> None:
        """The stream and its group exist, with the inbox TTL (idempotent)."""
        try:
            await self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await self.redis.pexpire(self.stream, self.ttl_ms)

    async def refresh(self) -> None:
        """Extend the inbox's life by its TTL (every heartbeat); recreate it if it
        expired meanwhile (an outage longer than the TTL)."""
        if not await self.redis.pexpire(self.stream, self.ttl_ms):
            await self.ensure()

    async def delete(self) -> None:
        """Graceful stop: the inbox goes with the instance (unanswered requests time
        out at their senders, which deliver them elsewhere)."""
        await self.redis.delete(self.stream)

    async def _reread_own_pending(self) -> None:
        """Entries this consumer read before a drop and never acknowledged."""
        while True:
            reply: Any = await self.redis.xreadgroup(
                GROUP, self.consumer, {self.stream: "0"}, count=_BATCH
            )
            entries = [e for _, batch in reply or [] for e in batch]
            if not entries:
                return
            await self._handle_batch(entries)

    async def _claim_abandoned(self) -> None:
        """Entries another consumer (a dead process of this instance) left idle."""
        cursor = "0-0"
        while True:
            reply: Any = await self.redis.xautoclaim(
                self.stream,
                GROUP,
                self.consumer,
                min_idle_time=self.inst.config.heartbeat_ttl_ms,
                start_id=cursor,
                count=_BATCH,
            )
            cursor, entries = _text(reply[0]), reply[1]
            if entries:
                log.warning(
                    "%s claimed %d abandoned inbox entries", self.inst.instance_id, len(entries)
                )
            await self._handle_batch(entries)
            if cursor == "0-0":
                return

    async def _handle_batch(self, entries: list[tuple[Any, Any]]) -> None:
        """Answer the entries read together: accepted as one batch, the answers pushed
        per reply list (one push for the entries of one batch delivery), then all
        acknowledged and deleted (in that order). Entries of a single delivery (no
        ``reply_id``) and a batch that breaks acceptance are answered one by one."""
        batched: list[tuple[Any, dict[str, str]]] = []
        for entry_id, fields in entries:
            f = {_text(k): _text(v) for k, v in (fields or {}).items()}
            if f and "reply_id" in f and f.get("reply_to"):
                batched.append((entry_id, f))
            else:
                await self._handle(entry_id, fields)
        if not batched:
            return
        answers = await self._answer_many([f.get("request", "") for _, f in batched])
        by_list: dict[str, list[str]] = {}
        for (_, f), answer in zip(batched, answers, strict=True):
            answer["reply_id"] = f["reply_id"]
            by_list.setdefault(f["reply_to"], []).append(json.dumps(answer))
        for reply_to, values in by_list.items():
            pipe = self.redis.pipeline(transaction=True)
            pipe.rpush(reply_to, *values)
            pipe.expire(reply_to, REPLY_TTL_S)
            ensure_transaction_slot("inbox reply", pipe)
            await pipe.execute()
        ids = [entry_id for entry_id, _ in batched]
        pipe = self.redis.pipeline(transaction=True)
        pipe.xack(self.stream, GROUP, *ids)
        pipe.xdel(self.stream, *ids)
        ensure_transaction_slot("inbox ack", pipe)
        await pipe.execute()

    async def _answer_many(self, raws: list[str]) -> list[dict[str, Any]]:
        """:meth:`_answer` for a batch, accepted in one call (``accept_many``)."""
        bodies: list[Any] = []
        for raw in raws:
            try:
                bodies.append(json.loads(raw))
            except ValueError:
                bodies.append(None)
        valid = [i for i, body in enumerate(bodies) if isinstance(body, dict)]
        try:
            accepted = await self.inst.accept_many([bodies[i] for i in valid])
        except TRANSIENT_ERRORS:
            raise  # unanswered and unacknowledged: re-read after the restart
        except Exception:  # one request broke the batch: answer each alone
            log.exception("%s: inbox batch failed; answering one by one", self.inst.instance_id)
            return [await self._answer(raw) for raw in raws]
        out: list[dict[str, Any]] = [
            {"error": "run request: not a JSON object", "reason": "invalid"} for _ in raws
        ]
        for i, answer in zip(valid, accepted, strict=True):
            out[i] = {"run_id": answer} if isinstance(answer, str) else _refusal(answer)
        return out

    async def _handle(self, entry_id: Any, fields: Any) -> None:
        """Answer one entry, then acknowledge and delete it (in that order)."""
        if fields:  # an entry deleted while pending comes back without fields
            f = {_text(k): _text(v) for k, v in fields.items()}
            answer = await self._answer(f.get("request", ""))
            if f.get("reply_to"):
                pipe = self.redis.pipeline(transaction=True)
                pipe.rpush(f["reply_to"], json.dumps(answer))
                pipe.expire(f["reply_to"], REPLY_TTL_S)
                ensure_transaction_slot("inbox reply", pipe)
                await pipe.execute()
        pipe = self.redis.pipeline(transaction=True)
        pipe.xack(self.stream, GROUP, entry_id)
        pipe.xdel(self.stream, entry_id)
        ensure_transaction_slot("inbox ack", pipe)
        await pipe.execute()

    async def _answer(self, raw: str) -> dict[str, Any]:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        try:
            if not isinstance(body, dict):
                raise RunRefused("run request: not a JSON object", reason="invalid")
            # accept() validates the dict and names the offending field
            # (e.g. "run request snapshot: Field required").
            return {"run_id": await self.inst.accept(body)}
        except RunRefused as exc:
            return _refusal(exc)
        except TRANSIENT_ERRORS:
            raise  # unanswered and unacknowledged: re-read after the restart
        except Exception as exc:  # a request that breaks accept() must not block the inbox
            log.exception("%s: inbox request failed", self.inst.instance_id)
            return {"error": f"internal error: {type(exc).__name__}", "reason": "error"}
