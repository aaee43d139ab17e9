"""The handlers that ship with airuntime (declared as entry points in pyproject.toml).

- ``noop`` (:func:`noop`): does nothing, output ``None``.
- ``sleep`` (:func:`sleep`): waits ``seconds`` (cancellable), output ``value`` or ``None``.
- ``echo`` (:func:`echo`): output ``value``, or the whole ``with`` mapping if it has none.
- ``template`` (:func:`template`): ``string.Template(template).safe_substitute(values)``.
- ``python`` (:func:`python_call`): calls ``callable: "pkg.mod:func"`` with ``args``/``kwargs``,
  only in the modules the platform allows (``AIRUNTIME_PYTHON_HANDLER_MODULES``).
- ``http`` (:func:`http_request`): ``method``, ``url``, ``headers``, ``json``, ``timeout_s``,
  ``follow_redirects``; internal addresses are refused unless the platform allows them.
- ``input`` (:func:`input_step`): never run by workers, the engine completes input steps.
- ``fail`` (:func:`flaky`): fails the first ``fail_attempts`` attempts, then outputs ``value``.

Bad inputs raise :class:`~airuntime.engine.handlers.StepFailed` (retrying cannot fix them).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import math
import string
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airuntime.engine.handlers import (
    StepCancelled,
    StepContext,
    StepFailed,
    TransientError,
    shared_executor,
)
from airuntime.engine.handlers.python_policy import CallableRefused, resolve_callable
from airuntime.engine.handlers.retry_after import retry_after_s
from airuntime.engine.handlers.settings import handler_settings

if TYPE_CHECKING:
    import httpx

__all__ = [
    "echo",
    "flaky",
    "http_request",
    "input_step",
    "noop",
    "python_call",
    "sleep",
    "template",
]


def _mapping(ctx: StepContext) -> Mapping[str, Any]:
    if ctx.inputs is None:
        return {}
    if not isinstance(ctx.inputs, Mapping):
        raise StepFailed(f"step {ctx.step_id!r}: inputs must be a mapping (value={ctx.inputs!r})")
    return ctx.inputs


def _number(ctx: StepContext, key: str, default: float | None = None) -> float:
    raw = _mapping(ctx).get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise StepFailed(
            f"step {ctx.step_id!r}: with.{key} must be a finite number (value={raw!r})"
        )
    if raw < 0:
        raise StepFailed(f"step {ctx.step_id!r}: with.{key} must be >= 0 (value={raw!r})")
    return float(raw)


async def noop(ctx: StepContext) -> None:
    """Do nothing; output ``None``."""
    return None


async def sleep(ctx: StepContext) -> Any:
    """Wait ``seconds`` (cooperatively cancellable), then return ``value`` (default ``None``)."""
    seconds = _number(ctx, "seconds", 0.0)
    try:
        await asyncio.wait_for(ctx.cancelled.wait(), timeout=seconds)
    except TimeoutError:
        return _mapping(ctx).get("value")
    raise StepCancelled(f"step {ctx.step_id!r}: cancelled while sleeping")


async def echo(ctx: StepContext) -> Any:
    """Return ``with.value`` if present, else the whole ``with`` mapping."""
    inputs = ctx.inputs
    if isinstance(inputs, Mapping) and "value" in inputs:
        return inputs["value"]
    return inputs


async def template(ctx: StepContext) -> str:
    """Render ``with.template`` with ``string.Template(...).safe_substitute``.

    Placeholders (``$name`` or ``${name}``) are filled from ``with.values`` if given, else
    from the other ``with`` keys; non-string values are JSON-encoded and unknown
    placeholders are left as they are (no attribute access, no format-spec tricks).
    """
    inputs = _mapping(ctx)
    text = inputs.get("template")
    if not isinstance(text, str):
        raise StepFailed(f"step {ctx.step_id!r}: with.template must be a string (value={text!r})")
    values = inputs.get("values")
    if values is None:
        values = {k: v for k, v in inputs.items() if k != "template"}
    elif not isinstance(values, Mapping):
        raise StepFailed(f"step {ctx.step_id!r}: with.values must be a mapping (value={values!r})")
    mapping = {
        str(k): v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        for k, v in values.items()
    }
    return string.Template(text).safe_substitute(mapping)


def _import_callable(ctx: StepContext, spec: Any) -> Any:
    modules = handler_settings().python_handler_modules
    try:
        return resolve_callable(spec, modules)
    except CallableRefused as exc:
        raise StepFailed(f"step {ctx.step_id!r}: with.callable {exc}") from None
    except ImportError as exc:
        raise StepFailed(f"step {ctx.step_id!r}: cannot import {spec!r}: {exc}") from exc
    except AttributeError as exc:
        raise StepFailed(f"step {ctx.step_id!r}: {spec!r} not found: {exc}") from exc


async def python_call(ctx: StepContext) -> Any:
    """Import ``with.callable`` (``"pkg.mod:func"``) and call it with ``args``/``kwargs``.

    Only callables of the modules the platform allows (``AIRUNTIME_PYTHON_HANDLER_MODULES``,
    see :mod:`~airuntime.engine.handlers.python_policy`) can be named; the check runs when
    the pipeline compiles and again here. Coroutine functions are awaited on the loop,
    plain functions run in the shared handler thread pool (a cancelled step stops
    waiting for them, but a plain function, which gets no context to look at, runs to
    its end in its thread).
    """
    inputs = _mapping(ctx)
    fn = _import_callable(ctx, inputs.get("callable"))
    args = inputs.get("args", [])
    kwargs = inputs.get("kwargs", {})
    if not isinstance(args, list):
        raise StepFailed(f"step {ctx.step_id!r}: with.args must be a list (value={args!r})")
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise StepFailed(f"step {ctx.step_id!r}: with.kwargs must be a mapping (value={kwargs!r})")
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    result = await loop.run_in_executor(shared_executor(), lambda: context.run(fn, *args, **kwargs))
    if inspect.isawaitable(result):
        result = await result
    return result


def _http_client(timeout_s: float) -> httpx.AsyncClient:
    """Client factory (a seam for tests of response handling to plug in
    ``httpx.MockTransport``): connects only where :mod:`~airuntime.engine.handlers.egress`
    allows, with the platform's current settings."""
    import httpx

    from airuntime.engine.handlers.egress import EgressPolicy, GuardedTransport

    policy = EgressPolicy.from_settings(handler_settings())
    return httpx.AsyncClient(
        timeout=timeout_s, transport=GuardedTransport(policy), trust_env=False, max_redirects=5
    )


_RETRYABLE_STATUS = frozenset({408, 425, 429})


def _request_options(ctx: StepContext) -> tuple[str, str, dict[str, Any], bool]:
    """``method``, ``url``, the keyword arguments of the request and ``follow_redirects``."""
    inputs = _mapping(ctx)
    method = inputs.get("method", "GET")
    url = inputs.get("url")
    headers = inputs.get("headers") or {}
    follow = inputs.get("follow_redirects", False)
    if not isinstance(method, str) or not method:
        raise StepFailed(f"step {ctx.step_id!r}: with.method must be a string (value={method!r})")
    if not isinstance(url, str) or not url:
        raise StepFailed(f"step {ctx.step_id!r}: with.url must be a string (value={url!r})")
    if not isinstance(headers, Mapping):
        raise StepFailed(
            f"step {ctx.step_id!r}: with.headers must be a mapping (value={headers!r})"
        )
    if not isinstance(follow, bool):
        raise StepFailed(
            f"step {ctx.step_id!r}: with.follow_redirects must be true or false (value={follow!r})"
        )
    kwargs: dict[str, Any] = {"headers": {str(k): str(v) for k, v in headers.items()}}
    if "json" in inputs:
        kwargs["json"] = inputs["json"]
    return method.upper(), url, kwargs, follow


async def http_request(ctx: StepContext) -> dict[str, Any]:
    """One HTTP request with httpx; output ``{"status": int, "json": ...}`` when the response
    is JSON, else ``{"status": int, "text": str}``.

    5xx, 408/425/429 and network errors raise :class:`TransientError` so the engine retries
    (no sooner than the response's ``Retry-After``);
    other 4xx are returned as output (the request was understood and answered). Redirects
    are followed only with ``follow_redirects: true`` (at most 5). Internal addresses
    (loopback, link-local and metadata, private, CGNAT, ...) are refused on every
    connection, redirects included, unless the platform allows them
    (:mod:`~airuntime.engine.handlers.egress`); a refusal is never retried.
    """
    import httpx

    from airuntime.engine.handlers.egress import EgressRefused

    method, url, request_kwargs, follow = _request_options(ctx)
    timeout_s = _number(ctx, "timeout_s", 30.0)
    try:
        async with _http_client(timeout_s) as client:
            response = await client.request(method, url, follow_redirects=follow, **request_kwargs)
    except EgressRefused as exc:
        raise StepFailed(f"step {ctx.step_id!r}: {method} {url} refused: {exc}") from None
    except httpx.TooManyRedirects as exc:
        raise StepFailed(f"step {ctx.step_id!r}: {method} {url}: {exc}") from exc
    except httpx.InvalidURL as exc:
        raise StepFailed(f"step {ctx.step_id!r}: invalid url {url!r}: {exc}") from exc
    except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
        raise StepFailed(f"step {ctx.step_id!r}: {method} {url}: {exc}") from exc
    except (httpx.TransportError, httpx.TimeoutException) as exc:
        raise TransientError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    status = response.status_code
    if status >= 500 or status in _RETRYABLE_STATUS:
        raise TransientError(
            f"{method} {url}: HTTP {status}: {response.text[:200]}",
            retry_after_s=retry_after_s(response.headers),
        )
    content_type = response.headers.get("content-type", "")
    if "json" in content_type:
        try:
            return {"status": status, "json": response.json()}
        except ValueError:
            pass
    return {"status": status, "text": response.text}


async def input_step(ctx: StepContext) -> Any:
    """Placeholder for ``uses: input`` steps: workers must never run it."""
    raise StepFailed(
        f"step {ctx.step_id!r} of execution {ctx.execution_id!r} uses the 'input' handler, "
        "which is never executed by a worker: the engine completes input steps when the "
        "input is submitted"
    )


async def flaky(ctx: StepContext) -> Any:
    """Raise :class:`TransientError` while ``attempt <= with.fail_attempts``, then return
    ``with.value``.  For examples and tests of retries."""
    inputs = _mapping(ctx)
    fail_attempts = inputs.get("fail_attempts", 1)
    if isinstance(fail_attempts, bool) or not isinstance(fail_attempts, int):
        raise StepFailed(
            f"step {ctx.step_id!r}: with.fail_attempts must be an integer (value={fail_attempts!r})"
        )
    if ctx.attempt <= fail_attempts:
        raise TransientError(
            f"step {ctx.step_id!r}: planned failure {ctx.attempt} of {fail_attempts}"
        )
    return inputs.get("value")
