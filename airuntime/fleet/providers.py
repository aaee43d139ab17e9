"""How a run request reaches a runtime instance's local queue: one narrow interface.

Three transports, one contract (:class:`RuntimeProvider`): deliver a
:class:`~airuntime.fleet.runs.RunRequest` to one instance and get its ``RunId`` back, or a
:class:`DeliveryError` saying why the instance refused (queue full, paused, bad
request) or could not be reached. Delivery is idempotent by SharedRunId on the
instance side, so a retried delivery never creates a second run.

* ``local`` — an instance object in this process (tests, ``airt up`` child hosts).
* ``redis`` — the instance's Redis stream inbox; the reply comes back on a list. The
  inbox exists only while its instance lives (``XADD NOMKSTREAM``: a request for a dead
  instance fails at once instead of recreating its inbox), and the reply is awaited in
  slices shorter than the client's socket timeout (:mod:`airuntime.fleet.blocking`).
* ``http`` — ``POST {endpoint}/v1/instances/{id}/runs`` with the runtime token
  (``Authorization: Bearer``; the runtime answers 401 without it).

A pump delivers its batch per instance (:meth:`RuntimeProvider.deliver_many`): the
``local`` provider hands the instance all N runs in one call (``accept_many``: one
round trip of acceptance scripts); ``redis`` adds the N entries in one pipeline with
one reply list for the batch (each entry names its ``reply_id``, echoed in its answer,
so answers are matched whatever order they come in; a single delivery is a batch of
one) and the instance answers the entries it read together with one push; ``http``
sends the N deliveries concurrently.
Each answer is a RunId or the :class:`DeliveryError` of that run alone.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Protocol

import httpx
from redis.exceptions import RedisError

from airuntime.core import keys
from airuntime.core.context import use_context
from airuntime.core.errors import AirError
from airuntime.core.redis_client import RedisClient
from airuntime.fleet.blocking import block_slice_s, unless_unblocked
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.runs import RunRequest


class DeliveryError(AirError):
    """The instance refused the run or could not be reached; ``reason`` is a short code."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AcceptsRuns(Protocol):
    instance_id: str

    async def accept(self, request: RunRequest) -> str: ...


Delivered = str | DeliveryError
"""One run's answer in a batch delivery: its RunId, or why it was not delivered."""


class RuntimeProvider(Protocol):
    name: str

    async def deliver(self, instance: InstanceDescriptor, request: RunRequest) -> str: ...

    async def deliver_many(
        self, instance: InstanceDescriptor, requests: list[RunRequest]
    ) -> list[Delivered]: ...


async def deliver_each(
    provider: RuntimeProvider, instance: InstanceDescriptor, requests: list[RunRequest]
) -> list[Delivered]:
    """A batch as concurrent single deliveries; a run that failed answers its
    :class:`DeliveryError` (any other error becomes one with reason ``unreachable``)."""

    async def one(request: RunRequest) -> Delivered:
        try:
            with use_context(request.snapshot):  # each delivery under its own run's context
                return await provider.deliver(instance, request)
        except DeliveryError as exc:
            return exc
        except (OSError, RedisError) as exc:
            return DeliveryError(f"{type(exc).__name__}: {exc}", reason="unreachable")

    return list(await asyncio.gather(*(one(r) for r in requests)))


class LocalProvider:
    """Instances living in this process, by id."""

    name = "local"

    def __init__(self) -> None:
        self.instances: dict[str, AcceptsRuns] = {}

    def add(self, instance: AcceptsRuns) -> None:
        self.instances[instance.instance_id] = instance

    def remove(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)

    async def deliver(self, instance: InstanceDescriptor, request: RunRequest) -> str:
        target = self.instances.get(instance.instance_id)
        if target is None:
            raise DeliveryError(
                f"Runtime instance {instance.instance_id} is not hosted in this process.",
                reason="unreachable",
            )
        return await target.accept(request)

    async def deliver_many(
        self, instance: InstanceDescriptor, requests: list[RunRequest]
    ) -> list[Delivered]:
        target = self.instances.get(instance.instance_id)
        accept_many = getattr(target, "accept_many", None)
        if target is None or accept_many is None:
            return await deliver_each(self, instance, requests)
        answers: list[str | Exception] = await accept_many(requests)
        return [
            a
            if isinstance(a, str)
            else DeliveryError(str(a), reason=str(getattr(a, "reason", "refused")))
            for a in answers
        ]


INBOX_MAXLEN = 10_000
"""Approximate cap of an instance's inbox (requests it has not read yet)."""


class RedisProvider:
    """Delivers through ``air:instance:<id>:inbox`` and waits for the reply."""

    name = "redis"

    def __init__(self, redis: RedisClient, timeout_s: float = 10.0) -> None:
        self.redis = redis
        self.timeout_s = timeout_s

    async def deliver(self, instance: InstanceDescriptor, request: RunRequest) -> str:
        answer = (await self._send(instance, [request]))[0]
        if isinstance(answer, DeliveryError):
            raise answer
        return answer

    async def deliver_many(
        self, instance: InstanceDescriptor, requests: list[RunRequest]
    ) -> list[Delivered]:
        try:
            return await self._send(instance, requests)
        except (OSError, RedisError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            return [DeliveryError(why, reason="unreachable") for _ in requests]

    async def _send(
        self, instance: InstanceDescriptor, requests: list[RunRequest]
    ) -> list[Delivered]:
        """The N requests as N inbox entries added in one round trip, answered on one
        reply list; a request with no answer by ``timeout_s`` fails alone (timeout)."""
        iid = instance.instance_id
        reply_to = keys.reply_list(uuid.uuid4().hex)
        pipe = self.redis.pipeline(transaction=False)
        for i, request in enumerate(requests):
            pipe.xadd(
                keys.instance_inbox(iid),
                {"request": request.model_dump_json(), "reply_to": reply_to, "reply_id": str(i)},
                maxlen=INBOX_MAXLEN,
                approximate=True,
                nomkstream=True,
            )
        out: list[Delivered | None] = [None] * len(requests)
        for i, entry_id in enumerate(await pipe.execute()):
            if entry_id is None:
                out[i] = DeliveryError(
                    f"Runtime instance {iid} has no inbox (it is not running).",
                    reason="unreachable",
                )
        waiting = sum(1 for o in out if o is None)
        deadline = time.monotonic() + self.timeout_s
        while waiting and time.monotonic() < deadline:
            for raw in await self._replies(reply_to, waiting, deadline - time.monotonic()):
                try:
                    body = json.loads(raw)
                except ValueError:
                    continue  # not an answer (an instance writes JSON objects only)
                at = _reply_index(body, len(requests))
                if at is None or out[at] is not None:
                    continue  # not one of ours, or answered again after a restart
                try:
                    out[at] = _parse_reply(iid, body)
                except DeliveryError as exc:
                    out[at] = exc
                waiting -= 1
        late = f"Runtime instance {iid} did not answer in {self.timeout_s} s."
        return [DeliveryError(late, reason="timeout") if o is None else o for o in out]

    async def _replies(self, reply_to: str, most: int, left: float) -> list[Any]:
        """The answers waiting on ``reply_to`` (at most ``most``), blocking up to
        ``left`` seconds (in slices the connection's socket timeout allows) for the
        first one."""
        if left <= 0:
            return []
        got: Any = await unless_unblocked(
            lambda: self.redis.blpop([reply_to], timeout=block_slice_s(self.redis, left)),
            f"reply wait on {reply_to}",
        )
        if got is None:
            return []
        more: Any = await self.redis.lpop(reply_to, most - 1) if most > 1 else None
        return [got[1], *(more or [])]


class HttpProvider:
    """Delivers with ``POST {endpoint}/v1/instances/{id}/runs``, sending the runtime token."""

    name = "http"

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 10.0,
        *,
        token: str | None = None,
    ) -> None:
        self.client = client or httpx.AsyncClient(timeout=timeout_s)
        self.token = token

    async def deliver(self, instance: InstanceDescriptor, request: RunRequest) -> str:
        if not instance.endpoint:
            raise DeliveryError(
                f"Runtime instance {instance.instance_id} has no HTTP endpoint.",
                reason="unreachable",
            )
        url = f"{instance.endpoint.rstrip('/')}/v1/instances/{instance.instance_id}/runs"
        headers = {"content-type": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        try:
            resp = await self.client.post(url, content=request.model_dump_json(), headers=headers)
        except httpx.HTTPError as exc:
            raise DeliveryError(
                f"Runtime instance {instance.instance_id} unreachable: {exc}", reason="unreachable"
            ) from None
        if resp.status_code == 401:
            raise DeliveryError(
                f"Runtime instance {instance.instance_id} refused the runtime token: "
                f"{_detail(resp)}",
                reason="unauthorized",
            )
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise DeliveryError(
                f"Runtime instance {instance.instance_id} answered {resp.status_code} "
                "without a run or a refusal",
                reason="unreachable",
            )
        return _parse_reply(instance.instance_id, body)

    async def deliver_many(
        self, instance: InstanceDescriptor, requests: list[RunRequest]
    ) -> list[Delivered]:
        return await deliver_each(self, instance, requests)


def _detail(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("detail", resp.text))
    except (ValueError, AttributeError):
        return resp.text


def _reply_index(body: Any, n: int) -> int | None:
    """The position in the batch an answer names (``reply_id``), if valid."""
    if not isinstance(body, dict):
        return None
    try:
        i = int(body.get("reply_id", -1))
    except (TypeError, ValueError):
        return None
    return i if 0 <= i < n else None


def _parse_reply(instance_id: str, body: dict[str, Any]) -> str:
    if "run_id" in body:
        return str(body["run_id"])
    raise DeliveryError(
        f"Runtime instance {instance_id} refused the run: {body.get('error', body)}",
        reason=str(body.get("reason", "refused")),
    )


def provider_for(
    name: str,
    *,
    redis: RedisClient,
    local: LocalProvider | None = None,
    runtime_token: str | None = None,
) -> RuntimeProvider:
    """The provider called ``name``; ``runtime_token`` is what the ``http`` provider sends."""
    if name == "redis":
        return RedisProvider(redis)
    if name == "http":
        return HttpProvider(token=runtime_token)
    if name == "local":
        return local or LocalProvider()
    raise ValueError(f"unknown runtime provider {name!r} (known: local, redis, http)")
