"""One compiled plan serves every run of one document, and never under other rules.

The cache must give the same answer :func:`compile_pipeline` would give right now: a
changed allowlist, handler registry or handler setting compiles again (and refuses
what the new rules refuse), a refusal is never kept, and the bounds hold (entries,
steps, a huge plan not kept). Many threads asking at once get equal plans.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from airuntime.engine.handlers import HandlerRegistry, default_registry
from airuntime.engine.pipeline import PipelineError, PlanCache, compile_pipeline, parse_pipeline

ENV = "AIRUNTIME_PYTHON_HANDLER_MODULES"


def chain(n: int, pipeline_id: str = "p") -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"id": "s0", "uses": "noop"}]
    steps += [{"id": f"s{i}", "uses": "noop", "depends_on": [f"s{i - 1}"]} for i in range(1, n)]
    return {"id": pipeline_id, "steps": steps}


PYTHON = {
    "id": "py",
    "steps": [
        {
            "id": "call",
            "uses": "python",
            "with": {"callable": "tests.engine.callables:add", "kwargs": {"a": 1, "b": 2}},
        }
    ],
}


def test_one_document_compiles_once_and_equals_a_fresh_compile() -> None:
    cache = PlanCache()
    doc = chain(3)
    first = cache.compile(doc)
    # The same document built again (another dict, another key order) is a hit.
    again = cache.compile({"steps": chain(3)["steps"], "id": "p"})
    assert again is first and (cache.hits, cache.misses) == (1, 1)
    fresh = compile_pipeline(parse_pipeline(doc))
    assert first.to_json() == fresh.to_json() and first.digest == fresh.digest
    assert cache.compile(chain(3, "q")) is not first, "another document, another plan"


def test_the_allowlist_is_part_of_the_key_and_refusals_are_not_kept() -> None:
    cache = PlanCache()
    doc = {"id": "p", "steps": [{"id": "a", "uses": "noop"}, {"id": "b", "uses": "fail"}]}
    open_plan = cache.compile(doc, allowed_handlers=None)
    for _ in range(2):  # refused each time, whatever was kept for other rules
        with pytest.raises(PipelineError) as info:
            cache.compile(doc, allowed_handlers=["noop"])
        assert "steps[1]" in str(info.value) and "'fail'" in str(info.value)
    assert len(cache) == 1
    assert cache.compile(doc, allowed_handlers=("fail", "noop")) is not open_plan
    assert cache.compile(doc, allowed_handlers={"noop", "fail"}) is cache.compile(
        doc, allowed_handlers=["fail", "noop"]
    ), "the allowlist is a set: its order does not matter"
    with pytest.raises(PipelineError):
        cache.compile({"id": "p", "steps": [{"id": "a", "uses": "no-such-handler"}]})
    assert len(cache) == 2


def test_a_changed_handler_setting_compiles_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = PlanCache()
    monkeypatch.setenv(ENV, "tests.engine.callables")
    allowed = cache.compile(PYTHON)
    assert cache.compile(PYTHON) is allowed
    monkeypatch.delenv(ENV)
    with pytest.raises(PipelineError) as info:
        cache.compile(PYTHON)
    assert "tests.engine.callables:add" in str(info.value)


def test_a_handler_registered_later_is_seen() -> None:
    registry = HandlerRegistry()
    cache = PlanCache(registry)
    doc = {"id": "p", "steps": [{"id": "a", "uses": "late"}]}
    with pytest.raises(PipelineError):
        cache.compile(doc)
    registry.register("late", default_registry().get("noop"))
    assert cache.compile(doc).steps[0].handler == "late"


def test_the_bounds_hold_least_recently_used_out_first() -> None:
    cache = PlanCache(max_plans=2, max_steps=10)
    a, b = cache.compile(chain(2, "a")), cache.compile(chain(2, "b"))
    assert cache.compile(chain(2, "a")) is a  # a is now the most recent
    cache.compile(chain(2, "c"))  # evicts b
    assert len(cache) == 2
    assert cache.compile(chain(2, "a")) is a
    assert cache.compile(chain(2, "b")) is not b
    cache.compile(chain(9, "big"))  # 9 steps: the others go until the steps fit
    assert len(cache) == 1
    huge = cache.compile(chain(11, "huge"))
    assert cache.compile(chain(11, "huge")) is not huge, "a plan over the budget is not kept"
    assert len(cache) == 1


def test_many_threads_at_once_get_equal_plans() -> None:
    cache = PlanCache()
    barrier = threading.Barrier(16)

    def ask(i: int) -> str:
        barrier.wait()
        return cache.compile(chain(20, f"p{i % 4}")).to_json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(16)))
    for i, answer in enumerate(answers):
        assert answer == compile_pipeline(parse_pipeline(chain(20, f"p{i % 4}"))).to_json()
    assert len(cache) == 4 and cache.hits + cache.misses == 16
