"""What the API reads of a request body: at most ``max_request_bytes``, strict JSON.

Why this module exists: FastAPI reads any body whole and parses it with ``json.loads``,
which takes ``NaN``, ``Infinity`` and ``1e999`` -- numbers JSON does not have, that
pydantic then stores as ``null`` -- and a body of any size. Here:

* :class:`BodyLimit` (ASGI middleware) refuses a body larger than the limit with 413
  and a message naming the limit, by its ``Content-Length`` before reading it, or as
  soon as the bytes read pass the limit;
* :class:`StrictJsonRoute` parses JSON bodies with :func:`strict_json`, which refuses
  every non-finite number with 422 naming where it is (``body.inputs.x``), in
  FastAPI's validation-error shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimit", "StrictJsonRoute", "strict_json", "too_large_message"]


def too_large_message(limit: int) -> str:
    return (
        f"request body larger than {limit} bytes (the API's max_request_bytes, "
        "AIRUNTIME_MAX_REQUEST_BYTES)"
    )


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuses request bodies larger than ``limit`` bytes with 413."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": too_large_message(self.limit)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class _NonFinite:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _number(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _where(value: Any, path: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], str]]:
    if isinstance(value, _NonFinite):
        return [(path, value.text)]
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in _where(v, (*path, k))]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in _where(v, (*path, i))]
    return []


def strict_json(body: bytes) -> Any:
    """``json.loads`` that refuses NaN, Infinity and numbers too large for a float (422)."""
    doc = json.loads(body, parse_constant=_NonFinite, parse_float=_number)
    hits = _where(doc, ("body",))
    if hits:
        raise HTTPException(
            422,
            [
                {
                    "type": "finite_number",
                    "loc": list(path),
                    "msg": f"{text} is not a finite number (JSON has no NaN or Infinity)",
                }
                for path, text in hits
            ],
        )
    return doc


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is parsed by :func:`strict_json`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict
