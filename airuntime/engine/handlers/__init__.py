"""Step handlers: the code a worker runs for one attempt of one step.

A handler is a plain callable taking a :class:`StepContext` and returning a JSON-serialisable
output, either ``def h(ctx) -> Any`` or ``async def h(ctx) -> Any``.  Handlers are looked up
by name (the ``uses`` field of a step) in a :class:`HandlerRegistry`.  The default registry
is filled from ``@handler("name")`` decorations and, lazily, from the ``airuntime.engine.handlers``
entry-point group, so third-party packages add handlers just by being installed.

:func:`invoke` is the one place that calls a handler: coroutine functions are awaited on the
event loop, everything else runs in a shared thread pool so a blocking handler never stalls
the worker's loop (and its lease heartbeats).

Raise :class:`TransientError` for failures worth retrying, :class:`StepFailed` for failures
that no retry can fix, and :class:`StepCancelled` after noticing a cancel (``await
ctx.cancelled.wait()`` in async handlers, ``ctx.is_cancelled()`` or
``ctx.wait_cancelled(timeout)`` in sync ones, which run in a thread).

Exactly-once and at-least-once
------------------------------
*State transitions are exactly-once.* A step is completed, failed or stopped only by
the Lua script that checks the claim token of its current claim; a worker whose claim
was replaced (its lease expired while it was frozen, and the step was recovered and
claimed again) is rejected as stale and changes nothing, and the same claim completing
twice (a retried call) is recognised as a duplicate. So the ledger holds one
completion per completed step (``step_completed`` read per step from a batch's
``steps_completed`` entry), whatever crashed or retried.

*Handler side effects are at-least-once.* A handler may run more than once for the same
attempt: a frozen worker may finish after another worker recovered its claim (recovery
does not consume an attempt), a worker may die after the effect and before its
completion was recorded, and a completion that could not be recorded before its lease
ran out is re-run elsewhere. Handlers that change the outside world make that safe
with two values of :class:`StepContext`:

* ``idempotency_key`` -- ``"<execution>:<step>:<attempt>"``: the same for every run of
  one logical attempt (the frozen worker and the worker that recovered its claim see
  the same key), different for a retry after a failure. Send it as the idempotency key
  of the external call (``Idempotency-Key`` header, a unique constraint) so the effect
  happens once per attempt.
* ``fencing_token`` / ``fencing_seq`` -- the claim token and its sequence number
  (``claim_seq`` of the execution: every claim gets a higher number than every claim
  before it, so the claim that replaced a lost one always carries a higher number). A
  store that remembers the highest ``fencing_seq`` it accepted for a key can refuse the
  late write of a stale worker (a fencing token in Kleppmann's sense).

Code that a handler calls without passing the context along -- the callable of a
``python`` step gets only its ``args``/``kwargs`` -- reads the running step's context
with :func:`current_step` (a context variable :func:`invoke` sets, also in the handler's
thread), so a ``python`` step can dedupe its effects with ``current_step().idempotency_key``.
"""

from __future__ import annotations

import asyncio
import contextvars
import difflib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from airuntime.engine.model_budget import ModelBudgets

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_RETRY_AFTER_S",
    "Handler",
    "HandlerError",
    "HandlerRegistry",
    "StepCancelled",
    "StepContext",
    "StepFailed",
    "TransientError",
    "UnknownHandlerError",
    "current_step",
    "default_registry",
    "handler",
    "invoke",
    "is_async_handler",
    "set_shared_executor",
    "shared_executor",
]

ENTRY_POINT_GROUP = "airuntime.handlers"

#: The built-in handlers, as declared in pyproject.toml.  Registered as a fallback so they are
#: available even when airuntime runs from a source tree without installed metadata.
BUILTIN_ENTRY_POINTS: dict[str, str] = {
    "noop": "airuntime.engine.handlers.builtin:noop",
    "sleep": "airuntime.engine.handlers.builtin:sleep",
    "echo": "airuntime.engine.handlers.builtin:echo",
    "template": "airuntime.engine.handlers.builtin:template",
    "python": "airuntime.engine.handlers.builtin:python_call",
    "http": "airuntime.engine.handlers.builtin:http_request",
    "input": "airuntime.engine.handlers.builtin:input_step",
    "fail": "airuntime.engine.handlers.builtin:flaky",
    "model": "airuntime.engine.handlers.model_call:model_call",
}


class HandlerError(Exception):
    """Base class of the exceptions handlers raise on purpose."""


class TransientError(HandlerError):
    """A failure that may go away: the engine retries while the step's retry policy allows.

    ``retry_after_s``: the earliest the other side said to try again (an HTTP
    ``Retry-After``); the retry waits at least that long (up to
    :data:`MAX_RETRY_AFTER_S`), or the policy's backoff when that is longer."""

    def __init__(self, *args: object, retry_after_s: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after_s = retry_after_s


MAX_RETRY_AFTER_S = 300.0
"""The longest a ``retry_after_s`` holds a retry back (a server asking for an hour does
not park a step for an hour; its retry policy still bounds the attempts)."""


class StepFailed(HandlerError):
    """A permanent failure: retrying cannot help, the step fails right away."""

    non_retryable = True


class StepCancelled(HandlerError):
    """The handler noticed ``ctx.cancelled`` and stopped early (not retried)."""

    non_retryable = True


class UnknownHandlerError(LookupError):
    """No handler is registered under the requested name."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        hint = difflib.get_close_matches(name, known, n=1)
        did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
        super().__init__(
            f"unknown handler {name!r} (known: {', '.join(known) or 'none'}){did_you_mean}"
        )

    def __str__(self) -> str:
        return str(self.args[0])


_CANCEL_LOCK = threading.Lock()
"""Orders a cancel against the lazy creation of a context's thread event."""


@dataclass
class StepContext:
    """Everything a handler gets for one attempt of one step."""

    execution_id: str
    step_id: str
    attempt: int
    inputs: Any
    pipeline_id: str
    tenant_id: str | None = None
    fencing_token: str = ""
    """The claim token this attempt runs under (see the module doc)."""
    fencing_seq: int = 0
    """The claim's sequence number in its execution: higher for every later claim."""
    model_budgets: ModelBudgets | None = None
    """The tenants' model token budgets (:mod:`airuntime.engine.model_budget`), which a
    ``model`` step draws from; None outside a worker pool (a direct call: no budget)."""
    _cancel_requested: bool = field(default=False, repr=False)
    _cancel_flag: threading.Event | None = field(default=None, repr=False)
    """Created only when a sync handler waits (wait_cancelled): most attempts never do."""
    _thread_future: Future[Any] | None = field(default=None, repr=False)
    _cancelled_event: asyncio.Event | None = field(default=None, repr=False)
    """Made when :attr:`cancelled` is first asked for: most attempts never ask."""

    @property
    def cancelled(self) -> asyncio.Event:
        """Set by the engine when the execution is cancelled, the lease is lost or the
        step timed out. Async handlers can ``await`` it; sync handlers (in a thread) use
        :meth:`is_cancelled` / :meth:`wait_cancelled`, which are thread-safe."""
        with _CANCEL_LOCK:
            event = self._cancelled_event
            if event is None:
                event = self._cancelled_event = asyncio.Event()
                if self._cancel_requested:
                    event.set()
        return event

    @property
    def idempotency_key(self) -> str:
        """``"<execution>:<step>:<attempt>"``: the same for every run of this attempt,
        also on the worker that recovered a lost claim (see the module doc)."""
        return f"{self.execution_id}:{self.step_id}:{self.attempt}"

    def is_cancelled(self) -> bool:
        """True once the engine asked this attempt to stop (safe from any thread)."""
        return self._cancel_requested

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block (a sync handler's thread) until a cancel or ``timeout``; True if cancelled.
        A sync handler sleeping with this stops at once when the step is cancelled."""
        with _CANCEL_LOCK:
            if self._cancel_flag is None:
                self._cancel_flag = threading.Event()
                if self._cancel_requested:
                    self._cancel_flag.set()
            flag = self._cancel_flag
        return flag.wait(timeout)

    def mark_cancelled(self) -> bool:
        """Ask this attempt to stop (the engine calls it, on the event loop's thread).

        A sync handler queued for a thread that has not started is withdrawn. Returns
        True if a thread is running the handler right now: it stops only when it notices
        (:meth:`is_cancelled`); otherwise nothing runs the handler any more, or it is an
        async handler, and the caller cancels its task."""
        with _CANCEL_LOCK:
            self._cancel_requested = True
            flag = self._cancel_flag
            event = self._cancelled_event
        if flag is not None:
            flag.set()
        if event is not None:
            event.set()
        future = self._thread_future
        if future is None or future.cancel():
            return False
        return future.running()


Handler = Callable[[StepContext], Any]

_CURRENT_STEP: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "airuntime_current_step", default=None
)


def current_step() -> StepContext | None:
    """The :class:`StepContext` of the handler attempt this code runs in (on the loop
    or in the handler's thread); None outside a handler."""
    return _CURRENT_STEP.get()


_H = TypeVar("_H", bound=Callable[..., Any])


class HandlerRegistry:
    """Name -> handler.

    Explicit :meth:`register` calls win over entry points.  :meth:`load_entry_points` only
    records entry points (``name -> "module:attr"``); the module is imported the first time
    the handler is fetched with :meth:`get`, so listing names never imports plugin code.
    With ``autoload=True`` entry points are loaded on the first lookup.
    """

    def __init__(
        self,
        *,
        autoload: bool = False,
        group: str = ENTRY_POINT_GROUP,
        include_builtins: bool = True,
    ) -> None:
        self._group = group
        self._autoload = autoload
        self._include_builtins = include_builtins
        self._handlers: dict[str, Handler] = {}
        self._lazy: dict[str, EntryPoint] = {}
        self._ambiguous: dict[str, list[str]] = {}
        self._entry_points_loaded = False
        self._lock = threading.RLock()

    # -- registration ---------------------------------------------------------------------
    def register(self, name: str, fn: Handler, *, replace: bool = False) -> Handler:
        """Register ``fn`` as ``name``.  Registering a different callable under a taken name
        raises ``ValueError`` unless ``replace=True``; re-registering the same one is a no-op."""
        if not name or not isinstance(name, str):
            raise ValueError(f"handler name: must be a non-empty string (value={name!r})")
        if not callable(fn):
            raise TypeError(f"handler {name!r}: not callable (value={fn!r})")
        with self._lock:
            current = self._handlers.get(name)
            if current is not None and current is not fn and not replace:
                raise ValueError(
                    f"handler {name!r} is already registered ({_qualname(current)}); "
                    "pass replace=True to override"
                )
            self._handlers[name] = fn
            self._lazy.pop(name, None)
            self._ambiguous.pop(name, None)
        return fn

    def handler(self, name: str) -> Callable[[_H], _H]:
        """Decorator form of :meth:`register`."""

        def decorate(fn: _H) -> _H:
            self.register(name, fn)
            return fn

        return decorate

    def load_entry_points(self) -> None:
        """Record the handlers of the entry-point group (once; later calls do nothing)."""
        with self._lock:
            if self._entry_points_loaded:
                return
            self._entry_points_loaded = True
            found: dict[str, list[EntryPoint]] = {}
            for ep in entry_points(group=self._group):
                if not any(other.value == ep.value for other in found.get(ep.name, [])):
                    found.setdefault(ep.name, []).append(ep)
            if self._include_builtins and self._group == ENTRY_POINT_GROUP:
                for name, value in BUILTIN_ENTRY_POINTS.items():
                    if name not in found:
                        found[name] = [EntryPoint(name=name, value=value, group=self._group)]
            for name, eps in sorted(found.items()):
                if name in self._handlers:
                    continue
                if len(eps) > 1:
                    self._ambiguous[name] = sorted(ep.value for ep in eps)
                self._lazy[name] = eps[0]

    # -- lookup ---------------------------------------------------------------------------
    def _maybe_autoload(self) -> None:
        if self._autoload and not self._entry_points_loaded:
            self.load_entry_points()

    def get(self, name: str) -> Handler:
        """The handler registered as ``name``; raises :class:`UnknownHandlerError`."""
        fn = self._handlers.get(name)
        if fn is not None:
            return fn
        self._maybe_autoload()
        with self._lock:
            fn = self._handlers.get(name)
            if fn is not None:
                return fn
            if name in self._ambiguous:
                raise LookupError(
                    f"handler {name!r} is provided by several entry points: "
                    f"{', '.join(self._ambiguous[name])}"
                )
            ep = self._lazy.get(name)
            if ep is None:
                raise UnknownHandlerError(name, self.names())
            try:
                loaded: Handler = ep.load()
            except Exception as exc:
                raise ImportError(
                    f"handler {name!r}: cannot load entry point {ep.value}: {exc}"
                ) from exc
            if not callable(loaded):
                raise TypeError(f"handler {name!r}: entry point {ep.value} is not callable")
            self._handlers[name] = loaded
            del self._lazy[name]
            return loaded

    def names(self) -> list[str]:
        """Sorted names of every known handler (loaded or not)."""
        self._maybe_autoload()
        with self._lock:
            return sorted({*self._handlers, *self._lazy})

    def __contains__(self, name: object) -> bool:
        self._maybe_autoload()
        return name in self._handlers or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def _qualname(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', repr(fn))}"


_DEFAULT_REGISTRY = HandlerRegistry(autoload=True)


def default_registry() -> HandlerRegistry:
    """The process-wide registry: ``@handler`` registrations plus entry points."""
    return _DEFAULT_REGISTRY


def handler(name: str) -> Callable[[_H], _H]:
    """``@handler("name")``: register the decorated function in the default registry."""
    return _DEFAULT_REGISTRY.handler(name)


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def shared_executor() -> ThreadPoolExecutor:
    """The thread pool that runs sync handlers (created on first use)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(thread_name_prefix="airuntime-handler")
        return _executor


def set_shared_executor(executor: ThreadPoolExecutor | None) -> ThreadPoolExecutor | None:
    """Replace the thread pool that runs sync handlers (None: a default one is created on
    next use); returns the previous one, which the caller shuts down if it wants to. A
    process whose sync handlers block for long (each holds a thread until it returns or
    notices a cancel) sizes the pool for them."""
    global _executor
    with _executor_lock:
        previous, _executor = _executor, executor
    return previous


def is_async_handler(fn: Callable[..., Any]) -> bool:
    """True for coroutine functions, partials of them and objects with ``async __call__``."""
    if isinstance(fn, functools.partial):
        return is_async_handler(fn.func)
    if inspect.iscoroutinefunction(fn):
        return True
    return inspect.iscoroutinefunction(type(fn).__call__)


_ASYNC_FLAGS: dict[int, tuple[Handler, bool]] = {}
""":func:`is_async_handler` of the handlers invoked lately, by ``id`` (the entry keeps
its handler alive, so the id is not reused while it is there)."""
_ASYNC_FLAGS_MAX = 1024


def _is_async_cached(fn: Handler) -> bool:
    """:func:`is_async_handler`, asked once per handler instead of once per step (two
    ``inspect`` calls every step otherwise)."""
    entry = _ASYNC_FLAGS.get(id(fn))
    if entry is not None and entry[0] is fn:
        return entry[1]
    flag = is_async_handler(fn)
    if len(_ASYNC_FLAGS) >= _ASYNC_FLAGS_MAX:
        _ASYNC_FLAGS.clear()
    _ASYNC_FLAGS[id(fn)] = (fn, flag)
    return flag


async def invoke(fn: Handler, ctx: StepContext, executor: Executor | None = None) -> Any:
    """Run one handler attempt and return its output.

    Async handlers are awaited on the running loop; sync handlers run in ``executor`` (the
    :func:`shared_executor` by default) with the caller's context variables.  If a sync
    handler returns an awaitable it is awaited on the loop.
    """
    current = _CURRENT_STEP.set(ctx)
    try:
        if _is_async_cached(fn):
            return await fn(ctx)
        context = contextvars.copy_context()
        future = (executor or shared_executor()).submit(context.run, _run_unless_cancelled, fn, ctx)
        ctx._thread_future = future
        try:
            result = await asyncio.wrap_future(future)
        finally:
            ctx._thread_future = None
        if inspect.isawaitable(result):
            result = await result
        return result
    finally:
        _CURRENT_STEP.reset(current)


def _run_unless_cancelled(fn: Handler, ctx: StepContext) -> Any:
    """In the handler's thread: a step cancelled while it waited for a thread never starts."""
    if ctx.is_cancelled():
        raise StepCancelled(f"step {ctx.step_id!r}: cancelled before it started")
    return fn(ctx)
