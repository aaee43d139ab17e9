"""``python`` steps call only what the platform allows: refused when the pipeline compiles
(naming the step, the callable and the allowed modules) and again when the handler runs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import StepContext, StepFailed, builtin
from airuntime.engine.handlers.settings import HandlerSettings
from airuntime.engine.pipeline import PipelineError, compile_pipeline, parse_pipeline
from airuntime.engine.worker_pool import WorkerPool

ENV = "AIRUNTIME_PYTHON_HANDLER_MODULES"
ALLOWED = "tests.engine.callables"


def pipeline(callable_: Any, **extra: Any) -> dict[str, Any]:
    return {
        "id": "p",
        "steps": [{"id": "call", "uses": "python", "with": {"callable": callable_, **extra}}],
    }


def compile_(doc: dict[str, Any], modules: list[str] | None = None) -> Any:
    return compile_pipeline(parse_pipeline(doc), python_modules=modules)


def ctx(inputs: dict[str, Any]) -> StepContext:
    return StepContext(execution_id="e", step_id="call", attempt=1, inputs=inputs, pipeline_id="p")


@pytest.fixture
def allow_test_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, f"mycompany.tools,{ALLOWED}")


def test_by_default_no_python_step_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(PipelineError) as info:
        compile_(pipeline("builtins:exec", args=["import os; print(os.environ)"]))
    message = str(info.value)
    assert "steps[0].with.callable: step 'call'" in message
    assert "'builtins:exec'" in message
    assert "allowed modules: none" in message and ENV in message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        pytest.param("builtins:exec", "module 'builtins' is not allowed", id="builtins"),
        pytest.param("os:system", "module 'os' is not allowed", id="os"),
        pytest.param("subprocess:run", "module 'subprocess' is not allowed", id="subprocess"),
        pytest.param("tests.engine.callablesx:add", "is not allowed", id="prefix-boundary"),
        pytest.param("tests.engine:callables", "module 'tests.engine' is not allowed", id="parent"),
        pytest.param(f"{ALLOWED}:add.__globals__", "'__globals__'", id="dunder"),
        pytest.param(f"{ALLOWED}:Tools.__class__.mro", "'__class__'", id="class-walk"),
        pytest.param(f"{ALLOWED}:_private", "'_private'", id="private"),
        pytest.param("tests..engine.callables:add", "empty name", id="dotdot"),
        pytest.param(f"{ALLOWED}:add.", "empty name", id="trailing-dot"),
        pytest.param(f"{ALLOWED}.add", "must look like", id="no-colon"),
        pytest.param(f"{ALLOWED}:a:b", "must look like", id="two-colons"),
        pytest.param(None, "must look like", id="missing"),
    ],
)
def test_refused_callables_name_the_step_callable_and_allowed_modules(
    spec: Any, fragment: str
) -> None:
    with pytest.raises(PipelineError) as info:
        compile_(pipeline(spec), [ALLOWED, "mycompany.tools"])
    message = str(info.value)
    assert "step 'call'" in message and fragment in message
    if spec is not None and ":" in spec and spec.count(":") == 1 and "is not allowed" in fragment:
        assert f"allowed modules: mycompany.tools, {ALLOWED}" in message


def test_a_reference_cannot_choose_the_callable() -> None:
    doc = pipeline("${inputs.fn}")
    doc["inputs"] = {"fn": f"{ALLOWED}:add"}
    with pytest.raises(PipelineError, match="must be written out, not a reference"):
        compile_(doc, [ALLOWED])


def test_an_allowed_callable_compiles(allow_test_module: None) -> None:
    plan = compile_(pipeline(f"{ALLOWED}:Tools.double", args=[2]))
    assert plan.steps[0].handler == "python"


def test_the_setting_refuses_modules_that_can_never_be_opened() -> None:
    for bad in ("os", "builtins.x", "_hidden", "a..b"):
        with pytest.raises(ValidationError, match="python_handler_modules"):
            HandlerSettings(python_handler_modules=bad)  # type: ignore[arg-type]
    assert HandlerSettings(python_handler_modules=" a.b , c ").python_handler_modules == (  # type: ignore[arg-type]
        "a.b",
        "c",
    )


# -- run time -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        pytest.param(f"{ALLOWED}:os.system", "'os' is module 'os', which is not allowed", id="os"),
        pytest.param(f"{ALLOWED}:dumps", "defined in 'json'", id="re-export"),
        pytest.param(f"{ALLOWED}:NOT_CALLABLE", "it is not callable", id="not-callable"),
        pytest.param("builtins:exec", "module 'builtins' is not allowed", id="builtins"),
    ],
)
async def test_the_handler_checks_again_when_it_runs(
    allow_test_module: None, spec: str, fragment: str
) -> None:
    with pytest.raises(StepFailed, match="refused") as info:
        await builtin.python_call(ctx({"callable": spec, "args": ["echo pwned"]}))
    assert fragment in str(info.value) and info.value.non_retryable


async def test_a_plan_compiled_elsewhere_is_refused_by_the_runtime(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled where the module was allowed, run where it is not: the step fails for good."""
    plan = compile_(pipeline(f"{ALLOWED}:add", args=[1, 2]), [ALLOWED])
    monkeypatch.delenv(ENV, raising=False)
    store = ExecutionStore(redis)
    eid = await store.create(plan)
    assert await WorkerPool(store).run(eid) == "Failed"
    snap = await store.snapshot(eid)
    assert snap is not None
    error = snap["steps"]["call"]["error"]
    assert f"'{ALLOWED}:add' is refused" in error and "allowed modules: none" in error
    assert snap["steps"]["call"]["attempts"] == 1


async def test_an_allowed_callable_runs(redis: Redis, allow_test_module: None) -> None:
    store = ExecutionStore(redis)
    eid = await store.create(compile_(pipeline(f"{ALLOWED}:add", args=[2, 3])))
    assert await WorkerPool(store).run(eid) == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None and snap["steps"]["call"]["output"] == 5
