"""Handler registry, invocation and the built-in handlers."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib.metadata
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import airuntime.engine.handlers as handlers_module
from airuntime.engine.handlers import (
    BUILTIN_ENTRY_POINTS,
    HandlerRegistry,
    StepCancelled,
    StepContext,
    StepFailed,
    TransientError,
    UnknownHandlerError,
    builtin,
    default_registry,
    handler,
    invoke,
    is_async_handler,
    shared_executor,
)

BUILTIN_NAMES = ["echo", "fail", "http", "input", "model", "noop", "python", "sleep", "template"]


def ctx(inputs: Any = None, *, attempt: int = 1, step_id: str = "s") -> StepContext:
    return StepContext(
        execution_id="e-1",
        step_id=step_id,
        attempt=attempt,
        inputs={} if inputs is None else inputs,
        pipeline_id="p",
    )


# --------------------------------------------------------------------------------------
# invoke
# --------------------------------------------------------------------------------------
async def test_a_sync_handler_runs_in_a_worker_thread_not_on_the_loop() -> None:
    loop_thread = threading.get_ident()

    def sync_handler(c: StepContext) -> dict[str, Any]:
        return {"thread": threading.get_ident(), "name": threading.current_thread().name}

    out = await invoke(sync_handler, ctx())
    assert out["thread"] != loop_thread
    assert out["name"].startswith("airuntime-handler")


async def test_an_async_handler_runs_on_the_loop_thread() -> None:
    loop_thread = threading.get_ident()

    async def async_handler(c: StepContext) -> int:
        await asyncio.sleep(0)
        return threading.get_ident()

    assert await invoke(async_handler, ctx()) == loop_thread


class RefusingExecutor(ThreadPoolExecutor):
    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an async handler must not go through the executor")


async def test_an_async_handler_does_not_hop_through_a_thread() -> None:
    async def async_handler(c: StepContext) -> str:
        return "direct"

    with RefusingExecutor() as pool:
        assert await invoke(async_handler, ctx(), pool) == "direct"


async def test_a_blocking_sync_handler_does_not_block_the_loop() -> None:
    started, release = threading.Event(), threading.Event()

    def blocking(c: StepContext) -> str:
        started.set()
        # Only the event loop releases this: if the handler blocked the loop, it never would.
        assert release.wait(30), "the handler blocked the event loop"
        return "done"

    call = asyncio.create_task(invoke(blocking, ctx()))
    assert await asyncio.to_thread(started.wait, 30)
    loop_ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(loop_ran.set)
    await loop_ran.wait()  # the loop keeps running while the handler blocks
    release.set()
    assert await call == "done"


async def test_sync_handlers_run_in_the_given_executor() -> None:
    with ThreadPoolExecutor(thread_name_prefix="custom-pool") as pool:
        name = await invoke(lambda c: threading.current_thread().name, ctx(), pool)
    assert name.startswith("custom-pool")


async def test_the_shared_executor_is_one_pool() -> None:
    assert shared_executor() is shared_executor()


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def test_context_variables_reach_sync_handlers() -> None:
    REQUEST_ID.set("r-42")
    assert await invoke(lambda c: REQUEST_ID.get(), ctx()) == "r-42"


class AsyncCallable:
    async def __call__(self, c: StepContext) -> str:
        return f"object:{threading.get_ident()}"


async def _async_with_suffix(c: StepContext, suffix: str) -> str:
    return f"{c.step_id}{suffix}:{threading.get_ident()}"


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(AsyncCallable(), id="an object with async __call__"),
        pytest.param(
            functools.partial(_async_with_suffix, suffix="!"),
            id="a partial of a coroutine function",
        ),
    ],
)
async def test_async_callables_of_any_shape_run_on_the_loop(fn: Any) -> None:
    assert is_async_handler(fn)
    out = await invoke(fn, ctx())
    assert out.endswith(f":{threading.get_ident()}")


async def test_a_sync_handler_returning_an_awaitable_is_awaited() -> None:
    async def later() -> str:
        return "awaited"

    assert await invoke(lambda c: later(), ctx()) == "awaited"


async def test_handler_exceptions_propagate() -> None:
    def broken(c: StepContext) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await invoke(broken, ctx())


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------
def test_register_get_and_names() -> None:
    registry = HandlerRegistry()

    def a(c: StepContext) -> None:
        return None

    registry.register("a", a)
    assert registry.get("a") is a
    assert registry.names() == ["a"]
    assert "a" in registry and "b" not in registry
    registry.register("a", a)  # the same callable again is fine


def test_registering_another_callable_under_a_taken_name_needs_replace() -> None:
    registry = HandlerRegistry()
    registry.register("a", lambda c: 1)
    with pytest.raises(ValueError, match="handler 'a' is already registered"):
        registry.register("a", lambda c: 2)
    registry.register("a", lambda c: 3, replace=True)
    assert registry.get("a")(ctx()) == 3


@pytest.mark.parametrize(
    ("name", "fn", "error"),
    [
        pytest.param("", lambda c: None, ValueError, id="an empty name"),
        pytest.param("x", "not callable", TypeError, id="a non-callable"),
    ],
)
def test_register_rejects_bad_arguments(name: str, fn: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        HandlerRegistry().register(name, fn)


def test_the_decorator_registers_and_returns_the_function() -> None:
    registry = HandlerRegistry()

    @registry.handler("double")
    def double(c: StepContext) -> int:
        return int(c.inputs["n"]) * 2

    assert registry.get("double") is double
    assert double(ctx({"n": 4})) == 8


def test_the_module_decorator_registers_in_the_default_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers_module, "_DEFAULT_REGISTRY", HandlerRegistry(autoload=True))

    @handler("test_handlers_module_decorator")
    async def custom(c: StepContext) -> str:
        return "ok"

    assert default_registry().get("test_handlers_module_decorator") is custom


def test_an_unknown_handler_error_lists_known_names_and_suggests() -> None:
    registry = HandlerRegistry()
    registry.register("summarize", lambda c: None)
    registry.register("echo", lambda c: None)
    with pytest.raises(UnknownHandlerError) as info:
        registry.get("sumarize")
    assert str(info.value) == (
        "unknown handler 'sumarize' (known: echo, summarize); did you mean 'summarize'?"
    )
    assert isinstance(info.value, LookupError)


def test_entry_point_loading_finds_the_builtins() -> None:
    installed = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="airuntime.handlers")
    }
    assert installed == BUILTIN_ENTRY_POINTS  # the package metadata is installed
    registry = HandlerRegistry(include_builtins=False)  # entry points only, no fallback
    assert registry.names() == []
    registry.load_entry_points()
    assert registry.names() == BUILTIN_NAMES
    assert registry.get("fail") is builtin.flaky
    assert registry.get("python") is builtin.python_call
    assert registry.get("http") is builtin.http_request
    assert registry.get("input") is builtin.input_step


def test_the_default_registry_loads_entry_points_on_first_use() -> None:
    assert set(BUILTIN_NAMES) <= set(default_registry().names())
    assert default_registry().get("echo") is builtin.echo


def test_entry_points_are_loaded_lazily_and_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def fake_entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
        nonlocal calls
        calls += 1
        return [
            importlib.metadata.EntryPoint("broken", "no_such_module_xyz:handler", group),
            importlib.metadata.EntryPoint("dumps", "json:dumps", group),
        ]

    monkeypatch.setattr(handlers_module, "entry_points", fake_entry_points)
    registry = HandlerRegistry(autoload=True, include_builtins=False)
    assert registry.names() == ["broken", "dumps"]  # listing imports nothing
    registry.load_entry_points()
    assert "dumps" in registry
    assert calls == 1
    assert registry.get("dumps") is json.dumps
    with pytest.raises(
        ImportError, match="handler 'broken': cannot load entry point no_such_module_xyz:handler"
    ):
        registry.get("broken")


def test_explicit_registrations_win_over_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        handlers_module,
        "entry_points",
        lambda group: [importlib.metadata.EntryPoint("echo", "json:dumps", group)],
    )
    registry = HandlerRegistry(autoload=True)

    def mine(c: StepContext) -> str:
        return "mine"

    registry.register("echo", mine)
    assert registry.get("noop") is builtin.noop  # fallback for builtins missing from metadata
    assert registry.get("echo") is mine  # entry points were loaded by now and did not win
    registry.load_entry_points()
    assert registry.get("echo") is mine


def test_an_entry_point_name_claimed_by_two_packages_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        handlers_module,
        "entry_points",
        lambda group: [
            importlib.metadata.EntryPoint("x", "json:dumps", group),
            importlib.metadata.EntryPoint("x", "json:loads", group),
            importlib.metadata.EntryPoint("y", "json:loads", group),
            importlib.metadata.EntryPoint("y", "json:loads", group),
        ],
    )
    registry = HandlerRegistry(autoload=True, include_builtins=False)
    with pytest.raises(
        LookupError, match="handler 'x' is provided by several entry points: json:dumps, json:loads"
    ):
        registry.get("x")
    loaded: Any = registry.get("y")
    assert loaded is json.loads  # the same target twice is not ambiguous


# --------------------------------------------------------------------------------------
# built-in handlers
# --------------------------------------------------------------------------------------
async def run_builtin(name: str, inputs: Any = None, **kw: Any) -> Any:
    return await invoke(default_registry().get(name), ctx(inputs, **kw))


async def test_noop_returns_none() -> None:
    assert await run_builtin("noop", {"anything": 1}) is None


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        pytest.param({"value": [1, 2]}, [1, 2], id="the value"),
        pytest.param({"value": None}, None, id="an explicit null value"),
        pytest.param({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, id="the whole mapping without value"),
    ],
)
async def test_echo(inputs: Any, expected: Any) -> None:
    assert await run_builtin("echo", inputs) == expected


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        pytest.param(
            {"template": "Hi $name!", "name": "Ana"},
            "Hi Ana!",
            id="placeholders from the other keys",
        ),
        pytest.param(
            {"template": "${a}-${b}", "values": {"a": 1, "b": {"k": [True]}}},
            '1-{"k": [true]}',
            id="values are JSON-encoded when not strings",
        ),
        pytest.param(
            {"template": "$missing and $$5"}, "$missing and $5", id="unknown placeholders are kept"
        ),
        pytest.param(
            {"template": "{0.__class__} {name.__dict__}", "name": "x"},
            "{0.__class__} {name.__dict__}",
            id="no format-string attribute access",
        ),
    ],
)
async def test_template(inputs: dict[str, Any], expected: str) -> None:
    assert await run_builtin("template", inputs) == expected


@pytest.mark.parametrize(
    ("name", "inputs", "fragment"),
    [
        pytest.param(
            "template",
            {"template": 3},
            "with.template must be a string (value=3)",
            id="template not a string",
        ),
        pytest.param(
            "template",
            {"template": "x", "values": [1]},
            "with.values must be a mapping",
            id="values not a mapping",
        ),
        pytest.param(
            "sleep", {"seconds": -1}, "with.seconds must be >= 0 (value=-1)", id="negative sleep"
        ),
        pytest.param(
            "sleep",
            {"seconds": "1"},
            "with.seconds must be a finite number (value='1')",
            id="sleep not a number",
        ),
        pytest.param(
            "python",
            {"callable": "tests.engine.callables.add"},
            "must look like 'package.module:function'",
            id="callable without colon",
        ),
        pytest.param(
            "python",
            {"callable": "tests.engine.callables.nothere:f"},
            "cannot import 'tests.engine.callables.nothere:f'",
            id="callable module missing",
        ),
        pytest.param(
            "python",
            {"callable": "tests.engine.callables:nope"},
            "'tests.engine.callables:nope' not found",
            id="callable attribute missing",
        ),
        pytest.param(
            "python",
            {"callable": "tests.engine.callables:NOT_CALLABLE"},
            "it is not callable",
            id="callable not callable",
        ),
        pytest.param(
            "python",
            {"callable": "tests.engine.callables:add", "args": "x"},
            "with.args must be a list",
            id="args not a list",
        ),
        pytest.param(
            "http",
            {"method": "GET"},
            "with.url must be a string (value=None)",
            id="http without url",
        ),
        pytest.param(
            "fail",
            {"fail_attempts": "2"},
            "with.fail_attempts must be an integer",
            id="fail_attempts not an int",
        ),
    ],
)
async def test_bad_inputs_fail_permanently(
    name: str, inputs: dict[str, Any], fragment: str, python_modules: None
) -> None:
    with pytest.raises(StepFailed) as info:
        await run_builtin(name, inputs)
    assert fragment in str(info.value)
    assert info.value.non_retryable is True


async def test_sleep_waits_and_returns_its_value() -> None:
    started = time.perf_counter()
    assert await run_builtin("sleep", {"seconds": 0.05, "value": 7}) == 7
    assert time.perf_counter() - started >= 0.045


async def test_sleep_stops_when_cancelled() -> None:
    c = ctx({"seconds": 30})
    task = asyncio.create_task(invoke(builtin.sleep, c))
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    c.cancelled.set()
    with pytest.raises(StepCancelled, match="cancelled while sleeping"):
        await task
    assert time.perf_counter() - started < 1


@pytest.fixture
def python_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRUNTIME_PYTHON_HANDLER_MODULES", "tests.engine.callables")


async def test_python_call_runs_sync_callables_in_the_pool(python_modules: None) -> None:
    out = await run_builtin(
        "python", {"callable": "tests.engine.callables:thread_name", "args": ["t:"]}
    )
    assert out.startswith("t:airuntime-handler")


async def test_python_call_awaits_coroutine_functions_on_the_loop(python_modules: None) -> None:
    out = await run_builtin(
        "python", {"callable": "tests.engine.callables:async_add", "kwargs": {"a": 2, "b": 3}}
    )
    assert out == {"sum": 5, "thread": threading.current_thread().name}


async def test_python_call_refuses_a_stdlib_function(python_modules: None) -> None:
    with pytest.raises(StepFailed, match="module 'json' is not allowed"):
        await run_builtin("python", {"callable": "json:dumps", "args": [{"b": 1}]})


@pytest.mark.parametrize(
    ("attempt", "raises"),
    [
        pytest.param(1, True, id="attempt 1 fails"),
        pytest.param(2, True, id="attempt 2 fails"),
        pytest.param(3, False, id="attempt 3 succeeds"),
    ],
)
async def test_flaky_fails_the_first_attempts(attempt: int, raises: bool) -> None:
    inputs = {"fail_attempts": 2, "value": "done"}
    if raises:
        with pytest.raises(TransientError, match=f"planned failure {attempt} of 2"):
            await run_builtin("fail", inputs, attempt=attempt)
        assert not getattr(TransientError("x"), "non_retryable", False)
    else:
        assert await run_builtin("fail", inputs, attempt=attempt) == "done"


async def test_input_step_is_never_run_by_a_worker() -> None:
    with pytest.raises(
        StepFailed, match="uses the 'input' handler, which is never executed by a worker"
    ):
        await run_builtin("input", {"prompt": "ok?"}, step_id="approve")


# -- http ---------------------------------------------------------------------------------
@pytest.fixture
def http_server(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Route the http handler to an in-process MockTransport; returns the requests seen."""
    seen: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if path == "/json":
            return httpx.Response(200, json={"echo": json.loads(request.content or b"null")})
        if path == "/text":
            return httpx.Response(200, text="plain")
        if path.startswith("/status/"):
            return httpx.Response(int(path.rsplit("/", 1)[1]), text="status body")
        if path == "/down":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(404, json={"error": "not found"})

    def client(timeout_s: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(respond), timeout=timeout_s)

    monkeypatch.setattr(builtin, "_http_client", client)
    return seen


async def test_http_returns_json(http_server: list[httpx.Request]) -> None:
    out = await run_builtin(
        "http",
        {
            "method": "post",
            "url": "http://api.test/json",
            "json": {"q": 1},
            "headers": {"X-Trace": 7},
        },
    )
    assert out == {"status": 200, "json": {"echo": {"q": 1}}}
    assert http_server[0].method == "POST"
    assert http_server[0].headers["x-trace"] == "7"


async def test_http_returns_text(http_server: list[httpx.Request]) -> None:
    assert await run_builtin("http", {"url": "http://api.test/text"}) == {
        "status": 200,
        "text": "plain",
    }


async def test_http_returns_client_errors_as_output(http_server: list[httpx.Request]) -> None:
    out = await run_builtin("http", {"url": "http://api.test/missing"})
    assert out == {"status": 404, "json": {"error": "not found"}}


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        pytest.param("/status/503", "HTTP 503", id="a 5xx response"),
        pytest.param("/status/500", "HTTP 500", id="a 500 response"),
        pytest.param("/status/429", "HTTP 429", id="too many requests"),
        pytest.param("/down", "ConnectError", id="a connection error"),
    ],
)
async def test_http_raises_transient_errors_so_the_engine_retries(
    http_server: list[httpx.Request], path: str, fragment: str
) -> None:
    with pytest.raises(TransientError, match=fragment):
        await run_builtin("http", {"url": f"http://api.test{path}"})
