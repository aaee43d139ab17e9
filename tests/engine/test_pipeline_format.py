"""The pipeline format: validation messages, loading, compilation into a Plan."""

from __future__ import annotations

import hashlib
import json
import sys
import time
import tomllib
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from airuntime.engine.handlers import BUILTIN_ENTRY_POINTS, HandlerRegistry
from airuntime.engine.pipeline import (
    ConcurrencySpec,
    Pipeline,
    PipelineError,
    PipelineLimits,
    PipelineSpec,
    Plan,
    ResolvedThrottle,
    RetryPolicy,
    StepRef,
    compile_pipeline,
    load_pipeline,
    load_plan,
    parse_pipeline,
    plan_json_of,
)
from airuntime.engine.pipeline import plan as plan_module
from airuntime.engine.pipeline.plan import COMPRESS_ABOVE_BYTES, COMPRESSED_PREFIX

ROOT = Path(__file__).resolve().parents[2]
#: built-ins only, whatever other tests register in the process-wide default registry
REGISTRY = HandlerRegistry(autoload=True)
EXAMPLE_DIR = ROOT / "airuntime" / "examples"
EXAMPLES = sorted(EXAMPLE_DIR.glob("*.yaml"))


def step(id: str, uses: str = "noop", **kw: Any) -> dict[str, Any]:
    return {"id": id, "uses": uses, **kw}


def pipeline(*steps: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"id": "p", "steps": list(steps), **kw}


def compile_data(data: dict[str, Any], limits: PipelineLimits | None = None, **kw: Any) -> Plan:
    spec = parse_pipeline(data)
    kw.setdefault("registry", REGISTRY)
    if limits is None:
        return compile_pipeline(spec, **kw)
    return compile_pipeline(spec, limits=limits, **kw)


def problems_of(data: dict[str, Any], limits: PipelineLimits | None = None) -> str:
    with pytest.raises(PipelineError) as info:
        compile_data(data, limits)
    return str(info.value)


# --------------------------------------------------------------------------------------
# invalid pipelines: the message names the field and the value
# --------------------------------------------------------------------------------------
INVALID = [
    pytest.param(
        pipeline(
            step("a"), step("b", depends_on=["a"]), step("c"), step("d", depends_on=["fetch_x"])
        ),
        None,
        ["steps[3].depends_on: unknown step 'fetch_x'"],
        id="depends_on an unknown step names the step and the missing id",
    ),
    pytest.param(
        pipeline(step("a"), step("b"), step("c"), step("d"), step("a")),
        None,
        ["steps: duplicate step id 'a' (steps[0] and steps[4])"],
        id="a duplicate step id names both positions",
    ),
    pytest.param(
        pipeline(
            step("a", depends_on=["b"]),
            step("b", depends_on=["c"]),
            step("c", depends_on=["a"]),
            step("d", depends_on=["a"]),
        ),
        None,
        ["steps: dependency cycle a -> b -> c -> a"],
        id="a dependency cycle is printed as a path",
    ),
    pytest.param(
        pipeline(step("x"), step("a", depends_on=["a"])),
        None,
        ["steps[1].depends_on: step 'a' depends on itself"],
        id="a step depending on itself is rejected",
    ),
    pytest.param(
        pipeline(step("a"), step("b"), step("c", "echo", with_={"text": "${steps.nope.output}"})),
        None,
        ["steps[2].with.text: reference to unknown step 'nope' in '${steps.nope.output}'"],
        id="a reference to an unknown step names the location and the reference",
    ),
    pytest.param(
        pipeline(step("a", "echo", with_={"deep": [{"v": "x ${steps.a.output.k} y"}]})),
        None,
        ["steps[0].with.deep[0].v: step 'a' references its own output in '${steps.a.output.k}'"],
        id="a step referencing its own output is rejected",
    ),
    pytest.param(
        pipeline(step("a"), step("b", "echo", with_={"text": "${steps.a}"})),
        None,
        ["steps[1].with.text: malformed reference", "'${steps.a}'"],
        id="a malformed reference is rejected with its text",
    ),
    pytest.param(
        pipeline(step("a"), step("b", "gpt")),
        None,
        [
            "steps[1].uses: unknown handler 'gpt' "
            "(known: echo, fail, http, input, model, noop, python, sleep, template)"
        ],
        id="an unknown handler lists the known ones",
    ),
    pytest.param(
        pipeline(step("a", "tempalte")),
        None,
        ["steps[0].uses: unknown handler 'tempalte'", "did you mean 'template'?"],
        id="an unknown handler suggests the closest name",
    ),
    pytest.param(
        pipeline(step("a"), step("b"), step("c"), step("d")),
        PipelineLimits(max_steps=3),
        ["steps: 4 steps is over the limit of 3"],
        id="more steps than max_steps is rejected",
    ),
    pytest.param(
        pipeline(step("a"), step("b", depends_on=["a"]), step("c", depends_on=["a", "b"])),
        PipelineLimits(max_edges=2),
        ["steps: 3 dependencies is over the limit of 2"],
        id="more dependencies than max_edges is rejected",
    ),
    pytest.param(
        pipeline(step("a", "echo", with_={"blob": "x" * 200})),
        PipelineLimits(max_input_bytes=100),
        ["steps[0].with: ", "is over the limit of 100 bytes"],
        id="a step whose JSON-encoded with is over max_input_bytes is rejected",
    ),
    pytest.param(
        pipeline(*[step(f"s{i}", "echo", with_={"blob": "x" * 60}) for i in range(5)]),
        PipelineLimits(max_pipeline_bytes=200),
        ["JSON-encoded step inputs are over the pipeline limit of 200 bytes"],
        id="step inputs adding up to more than max_pipeline_bytes are rejected",
    ),
    pytest.param(
        pipeline(step("a"), step("ok", "input", retry={"max_attempts": 3})),
        None,
        ["steps[1].retry.max_attempts: 'input' steps cannot be retried (value=3)"],
        id="an input step with retries is rejected",
    ),
    pytest.param(
        pipeline(step("ok", "input", concurrency={"provider": "openai"})),
        None,
        ["steps[0].concurrency: not allowed on 'input' steps", "'provider': 'openai'"],
        id="an input step with concurrency is rejected",
    ),
    pytest.param(
        pipeline(step("a", dependson=["x"])),
        None,
        ["steps[0].dependson: unknown field 'dependson', did you mean 'depends_on'?"],
        id="an unknown step field is named with a suggestion",
    ),
    pytest.param(
        {**pipeline(step("a")), "stepz": []},
        None,
        ["stepz: unknown field 'stepz'", "(allowed: id, description, failure_policy"],
        id="an unknown top-level field is named with the allowed ones",
    ),
    pytest.param(
        pipeline(step("a", retry={"max_attempts": 2, "backof": 1})),
        None,
        ["steps[0].retry.backof: unknown field 'backof'"],
        id="an unknown nested field is named",
    ),
    pytest.param(
        pipeline(step("1bad")),
        None,
        ["steps[0].id: String should match pattern", "(value='1bad')"],
        id="a step id not matching the id pattern is rejected",
    ),
    pytest.param(
        {"id": "has space", "steps": [step("a")]},
        None,
        ["id: String should match pattern", "(value='has space')"],
        id="a pipeline id not matching the id pattern is rejected",
    ),
    pytest.param(
        pipeline(step("a", retry={"backoff_initial_s": 5.0, "backoff_max_s": 1.0})),
        None,
        ["steps[0].retry.backoff_max_s: must be >= backoff_initial_s (5.0) (value=1.0)"],
        id="backoff_max_s below backoff_initial_s is rejected",
    ),
    pytest.param(
        pipeline(step("a", retry={"backoff_initial_s": 120.0})),
        None,
        ["steps[0].retry.backoff_max_s: must be >= backoff_initial_s (120.0) (value=60.0)"],
        id="the default backoff_max_s below a large backoff_initial_s is rejected",
    ),
    pytest.param(
        pipeline(step("a", retry={"max_attempts": 0}), step("b", retry={"max_attempts": 101})),
        None,
        [
            "steps[0].retry.max_attempts: Input should be greater than or equal to 1 (value=0)",
            "steps[1].retry.max_attempts: Input should be less than or equal to 100 (value=101)",
        ],
        id="max_attempts outside 1..100 is rejected",
    ),
    pytest.param(
        pipeline(step("a", retry={"jitter": 1.5}), step("b", retry={"backoff_multiplier": 0.5})),
        None,
        [
            "steps[0].retry.jitter",
            "(value=1.5)",
            "steps[1].retry.backoff_multiplier",
            "(value=0.5)",
        ],
        id="jitter above 1 and a multiplier below 1 are rejected",
    ),
    pytest.param(
        pipeline(step("a", retry={"max_attempts": True})),
        None,
        ["steps[0].retry.max_attempts: Input should be a valid integer (value=True)"],
        id="a boolean is not accepted as an integer",
    ),
    pytest.param(
        pipeline(step("a", timeout_s=0)),
        None,
        ["steps[0].timeout_s: Input should be greater than 0 (value=0)"],
        id="a zero timeout is rejected",
    ),
    pytest.param(
        pipeline(step("a", concurrency={})),
        None,
        ["steps[0].concurrency: at least one of provider, model, operation, key must be set"],
        id="an empty concurrency spec is rejected",
    ),
    pytest.param(
        pipeline(step("a"), throttle=[{"match": {"provider": "openai"}, "limit": -1}]),
        None,
        ["throttle[0].limit: Input should be greater than or equal to 0 (value=-1)"],
        id="a negative throttle limit is rejected",
    ),
    pytest.param(
        pipeline(step("a"), throttle=[{"match": {}, "limit": 1, "lease_ttl_s": 0}]),
        None,
        ["throttle[0].lease_ttl_s: Input should be greater than 0 (value=0)"],
        id="a zero lease ttl is rejected",
    ),
    pytest.param(
        pipeline(step("a"), failure_policy="ignore"),
        None,
        ["failure_policy: Input should be 'fail_fast' or 'continue' (value='ignore')"],
        id="an unknown failure policy is rejected",
    ),
    pytest.param(
        {"id": "p", "steps": []},
        None,
        ["steps: List should have at least 1 item", "(value=[])"],
        id="a pipeline without steps is rejected",
    ),
    pytest.param(
        pipeline({"id": "a"}),
        None,
        ["steps[0].uses: field required"],
        id="a step without uses is rejected",
    ),
    pytest.param(
        pipeline(step("a", "echo", with_={"n": float("nan")})),
        None,
        ["steps[0].with.n: not JSON-serialisable: nan is not a finite number"],
        id="NaN inside with is rejected",
    ),
    pytest.param(
        pipeline(step("a", "echo", with_={"tags": {"x", "y"}})),
        None,
        ["steps[0].with.tags: not JSON-serialisable: set"],
        id="a Python set inside with is rejected",
    ),
    pytest.param(
        pipeline(step("a", "echo", with_={"m": {1: "x"}})),
        None,
        ["steps[0].with.m: keys must be strings (key=1)"],
        id="a non-string key inside with is rejected",
    ),
]


def _with_alias(data: dict[str, Any]) -> dict[str, Any]:
    """The helpers write ``with_=`` (a Python keyword otherwise); the format says ``with``."""
    out = dict(data)
    out["steps"] = [
        {("with" if k == "with_" else k): v for k, v in s.items()} for s in data["steps"]
    ]
    return out


@pytest.mark.parametrize(("data", "limits", "expected"), INVALID)
def test_invalid_pipeline_is_rejected_with_a_message_naming_field_and_value(
    data: dict[str, Any], limits: PipelineLimits | None, expected: list[str]
) -> None:
    message = problems_of(_with_alias(data), limits)
    for fragment in expected:
        assert fragment in message


def test_every_problem_is_reported_one_per_line() -> None:
    data = _with_alias(
        pipeline(
            step("a", depends_on=["ghost"]),
            step("a"),
            step("b", "gpt"),
            step("c", "echo", with_={"t": "${steps.nope.output}"}),
        )
    )
    lines = problems_of(data).splitlines()
    assert len(lines) == 4
    assert lines[0] == "steps: duplicate step id 'a' (steps[0] and steps[1])"
    assert any(line.startswith("steps[0].depends_on: unknown step 'ghost'") for line in lines)
    assert any(line.startswith("steps[2].uses: unknown handler 'gpt'") for line in lines)
    assert any(
        line.startswith("steps[3].with.t: reference to unknown step 'nope'") for line in lines
    )


def test_pydantic_errors_do_not_leak_as_validation_errors() -> None:
    with pytest.raises(PipelineError) as info:
        parse_pipeline(
            {"id": "p", "steps": [{"id": "a", "uses": "noop", "retry": {"max_attempts": 0}}]}
        )
    error = info.value
    assert isinstance(error, ValueError)
    assert error.__cause__ is None and error.__suppress_context__
    assert [str(p) for p in error.problems] == [
        "steps[0].retry.max_attempts: Input should be greater than or equal to 1 (value=0)"
    ]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            [1, 2], "pipeline: Input should be a valid dictionary (value=[1, 2])", id="a list"
        ),
        pytest.param(
            "steps", "pipeline: Input should be a valid dictionary (value='steps')", id="a string"
        ),
    ],
)
def test_a_document_that_is_not_a_mapping_is_rejected(data: Any, expected: str) -> None:
    with pytest.raises(PipelineError, match="valid dictionary") as info:
        parse_pipeline(data)
    assert str(info.value) == expected


def test_a_cycle_in_a_long_chain_is_reported_shortened() -> None:
    n = 2_000
    steps = [step(f"s{i}", depends_on=[f"s{(i + 1) % n}"]) for i in range(n)]
    message = problems_of(pipeline(*steps))
    assert "steps: dependency cycle s0 -> s1 -> " in message
    assert "... 1980 more ..." in message
    assert "-> s1999 -> s0" in message


def test_a_cycle_through_a_reference_is_detected() -> None:
    data = _with_alias(
        pipeline(
            step("a", "echo", with_={"v": "${steps.b.output}"}),
            step("b", depends_on=["a"]),
        )
    )
    assert "steps: dependency cycle a -> b -> a" in problems_of(data)


def test_steps_downstream_of_a_cycle_are_not_reported_as_the_cycle() -> None:
    data = pipeline(
        step("head"),
        step("tail", depends_on=["x"]),
        step("x", depends_on=["y"]),
        step("y", depends_on=["x"]),
    )
    assert problems_of(data).splitlines()[0].startswith("steps: dependency cycle x -> y -> x")


# --------------------------------------------------------------------------------------
# loading files
# --------------------------------------------------------------------------------------
DOC = {
    "id": "files",
    "inputs": {"who": "world"},
    "steps": [
        {
            "id": "hello",
            "uses": "template",
            "with": {"template": "hi $who", "who": "${inputs.who}"},
        },
        {"id": "shout", "uses": "echo", "with": {"value": "${steps.hello.output}"}},
    ],
}


@pytest.mark.parametrize(
    ("name", "dump"),
    [
        pytest.param("p.yaml", yaml.safe_dump, id="yaml"),
        pytest.param("p.yml", yaml.safe_dump, id="yml"),
        pytest.param("p.json", json.dumps, id="json"),
        pytest.param("P.JSON", json.dumps, id="upper-case suffix"),
    ],
)
def test_yaml_and_json_files_load_to_the_same_spec(tmp_path: Path, name: str, dump: Any) -> None:
    path = tmp_path / name
    path.write_text(dump(DOC))
    spec = load_pipeline(path)
    assert spec == PipelineSpec.model_validate(DOC)
    plan = load_plan(str(path), registry=REGISTRY)
    assert [s.id for s in plan.steps] == ["hello", "shout"]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        pytest.param("p.toml", "id = 1", "unsupported file type '.toml'", id="unknown suffix"),
        pytest.param("pipeline", "id: p", "unsupported file type '(none)'", id="no suffix"),
        pytest.param(
            "p.yaml",
            "id: p\nsteps:\n  - id: a\n    uses: noop\n    uses: echo\n",
            "line 5, column 5: invalid YAML: while constructing a mapping "
            "found duplicate key 'uses'",
            id="duplicate YAML key",
        ),
        pytest.param(
            "p.json",
            '{"id": "p", "id": "q", "steps": []}',
            "duplicate key 'id'",
            id="duplicate JSON key",
        ),
        pytest.param("p.yaml", "id: p\nsteps: [\n", "invalid YAML", id="YAML syntax error"),
        pytest.param(
            "p.json", '{"id": "p",}', "line 1, column 12: invalid JSON", id="JSON syntax error"
        ),
        pytest.param("p.yaml", "", "the document is empty", id="empty file"),
        pytest.param(
            "p.yaml",
            "id: p\nsteps:\n  - id: a\n    uses: noop\n    extra: 1\n",
            "steps[0].extra: unknown field 'extra'",
            id="invalid content",
        ),
        pytest.param("p.yaml", "!!python/object:os.system {}", "invalid YAML", id="python tags"),
    ],
)
def test_a_bad_file_is_rejected_with_its_path(
    tmp_path: Path, name: str, content: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(PipelineError) as info:
        load_pipeline(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_a_missing_file_is_a_pipeline_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="cannot read: No such file"):
        load_pipeline(tmp_path / "missing.yaml")


def test_a_file_over_max_pipeline_bytes_is_rejected_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("id: p\n" + "# padding\n" * 200)
    with pytest.raises(PipelineError, match="the file is over the limit of 1000 bytes"):
        load_pipeline(path, limits=PipelineLimits(max_pipeline_bytes=1000))


def test_a_yaml_alias_bomb_is_bounded(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["xxxxxxxxxxxxxxxx"]']
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 20)]
    body = "\n".join("      " + line for line in lines)
    path = tmp_path / "bomb.yaml"
    path.write_text(f"id: bomb\nsteps:\n  - id: a\n    uses: echo\n    with:\n{body}\n")
    started = time.perf_counter()
    with pytest.raises(PipelineError, match=r"steps\[0\]\.with: at least \d+ bytes JSON-encoded"):
        load_plan(path, registry=REGISTRY)
    assert time.perf_counter() - started < 5


def test_load_plan_prefixes_compile_problems_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("id: p\nsteps:\n  - id: a\n    uses: nope\n")
    with pytest.raises(PipelineError) as info:
        load_plan(path, registry=REGISTRY)
    assert str(info.value).startswith(f"{path}: steps[0].uses: unknown handler 'nope'")


# --------------------------------------------------------------------------------------
# compilation
# --------------------------------------------------------------------------------------
def order_of(plan: Plan) -> list[str]:
    return [s.id for s in plan.steps]


def test_a_valid_declaration_order_is_kept() -> None:
    plan = compile_data(
        pipeline(
            step("a"), step("b", depends_on=["a"]), step("c"), step("d", depends_on=["b", "c"])
        )
    )
    assert order_of(plan) == ["a", "b", "c", "d"]
    assert [s.order for s in plan.steps] == [0, 1, 2, 3]
    assert plan.index == {"a": 0, "b": 1, "c": 2, "d": 3}


def test_topological_order_breaks_ties_by_declaration_order() -> None:
    plan = compile_data(
        pipeline(
            step("z", depends_on=["y"]),
            step("y", depends_on=["x"]),
            step("w"),
            step("x"),
            step("v", depends_on=["x"]),
        )
    )
    # ready at first: w (2), x (3); then y (1) and v (4) become ready -> y first
    assert order_of(plan) == ["w", "x", "y", "z", "v"]


def test_compilation_is_deterministic() -> None:
    data = pipeline(
        *[
            step(f"s{i}", depends_on=[f"s{j}" for j in range(i) if (i * j) % 7 == 1])
            for i in range(60)
        ]
    )
    plans = [compile_data(data) for _ in range(3)]
    assert plans[0] == plans[1] == plans[2]
    assert len({p.digest for p in plans}) == 1
    assert len({p.to_json() for p in plans}) == 1


def test_references_imply_dependencies_and_children() -> None:
    data = _with_alias(
        pipeline(
            step("fetch", "echo", with_={"value": {"items": [1, 2]}}),
            step("other"),
            step(
                "use",
                "template",
                with_={
                    "template": "$n",
                    "n": "${steps.fetch.output.items.1}",
                    "x": ["${inputs.k}"],
                },
                depends_on=["other"],
            ),
        )
    )
    plan = compile_data(data)
    use = plan.step("use")
    assert use.deps == ("fetch", "other")
    assert use.refs == ("fetch",)
    assert plan.step("fetch").children == ("use",)
    assert plan.step("other").children == ("use",)
    assert plan.roots == (plan.step("fetch"), plan.step("other"))


def test_repeated_dependencies_count_once() -> None:
    data = _with_alias(
        pipeline(
            step("a"),
            step(
                "b",
                "echo",
                depends_on=["a", "a"],
                with_={"v": ["${steps.a.output}", "${steps.a.output}"]},
            ),
        )
    )
    assert compile_data(data).step("b").deps == ("a",)


def test_deps_are_sorted_by_plan_order() -> None:
    plan = compile_data(
        pipeline(
            step("c", depends_on=["b"]),
            step("b", depends_on=["a"]),
            step("a"),
            step("d", depends_on=["c", "a", "b"]),
        )
    )
    assert order_of(plan) == ["a", "b", "c", "d"]
    assert plan.step("d").deps == ("a", "b", "c")


def test_plan_inputs_are_a_json_copy_of_the_spec() -> None:
    p = Pipeline(id="p", inputs={"t": ("a", "b")})
    p.step("a", "echo", with_={"value": ("x", 1)})
    built = p.build()
    plan = compile_pipeline(built, REGISTRY)
    assert plan.step("a").inputs == {"value": ["x", 1]}
    assert plan.inputs == {"t": ["a", "b"]}
    built.steps[0].with_["value"] = "changed"
    assert plan.step("a").inputs == {"value": ["x", 1]}


def test_retry_and_timeout_come_from_step_then_defaults_then_builtin_default() -> None:
    defaults = {"retry": {"max_attempts": 3}, "timeout_s": 9.0}
    plan = compile_data(
        pipeline(
            step("own", retry={"max_attempts": 5, "backoff_initial_s": 0.5}, timeout_s=2.0),
            step("inherits"),
            step("human", "input", timeout_s=3600.0),
            step("human_default", "input"),
            defaults=defaults,
        )
    )
    assert plan.step("own").retry == RetryPolicy(max_attempts=5, backoff_initial_s=0.5)
    assert plan.step("own").timeout_s == 2.0
    assert plan.step("inherits").retry == RetryPolicy(max_attempts=3)
    assert plan.step("inherits").timeout_s == 9.0
    # input steps never inherit retries or the workers' timeout
    assert plan.step("human").retry == RetryPolicy()
    assert plan.step("human").timeout_s == 3600.0
    assert plan.step("human_default").timeout_s is None
    assert plan.step("human").is_input and not plan.step("own").is_input
    assert compile_data(pipeline(step("a"))).step("a").retry == RetryPolicy()


def test_an_input_step_may_state_a_single_attempt() -> None:
    plan = compile_data(pipeline(step("ok", "input", retry={"max_attempts": 1})))
    assert plan.step("ok").retry.max_attempts == 1


RULES = [
    {"match": {"provider": "openai", "model": "gpt-x"}, "limit": 1},
    {"match": {"provider": "openai"}, "limit": 2, "lease_ttl_s": 5},
    {"match": {"operation": "embed"}, "limit": 0},
]


@pytest.mark.parametrize(
    ("concurrency", "expected"),
    [
        pytest.param(
            {"provider": "openai", "model": "gpt-x", "operation": "chat"},
            ResolvedThrottle("openai/gpt-x/chat", 1, 30.0),
            id="the first matching rule wins",
        ),
        pytest.param(
            {"provider": "openai", "model": "gpt-y", "operation": "chat"},
            ResolvedThrottle("openai/gpt-y/chat", 2, 5.0),
            id="a rule with a wildcard model matches any model",
        ),
        pytest.param(
            {"provider": "openai", "model": "gpt-x", "key": "tenant-1"},
            ResolvedThrottle("openai/gpt-x/*/tenant-1", 1, 30.0),
            id="the key extends the scope and unset parts are stars",
        ),
        pytest.param(
            {"provider": "local", "operation": "embed"},
            ResolvedThrottle("local/*/embed", 0, 30.0),
            id="a limit of zero is carried as a deny",
        ),
        pytest.param(
            {"provider": "anthropic", "model": "m"},
            None,
            id="no matching rule means no throttle",
        ),
        pytest.param(
            {"key": "tenant-1"},
            None,
            id="a key alone without a matching rule means no throttle",
        ),
        pytest.param(
            {"model": "gpt-x"},
            None,
            id="a rule for a provider does not match a step without provider",
        ),
        pytest.param(
            {"provider": "hf", "model": "meta/llama*3", "operation": "embed"},
            ResolvedThrottle("hf/meta%2Fllama%2A3/embed", 0, 30.0),
            id="slashes and stars inside a part are escaped in the scope",
        ),
    ],
)
def test_throttle_resolution(
    concurrency: dict[str, str], expected: ResolvedThrottle | None
) -> None:
    plan = compile_data(pipeline(step("a", concurrency=concurrency), throttle=RULES))
    assert plan.step("a").throttle == expected
    assert plan.step("a").concurrency == ConcurrencySpec.model_validate(concurrency)


def test_a_step_without_concurrency_is_never_throttled() -> None:
    plan = compile_data(pipeline(step("a"), throttle=[{"match": {}, "limit": 1}]))
    assert plan.step("a").throttle is None


def test_a_match_all_rule_applies_to_every_step_with_concurrency() -> None:
    plan = compile_data(
        pipeline(step("a", concurrency={"key": "k"}), throttle=[{"match": {}, "limit": 4}])
    )
    assert plan.step("a").throttle == ResolvedThrottle("*/*/*/k", 4, 30.0)


def test_plan_json_round_trip_is_equal() -> None:
    data = _with_alias(
        pipeline(
            step("a", "echo", with_={"value": {"nested": [1, 2.5, None, True, "ü"]}}),
            step("b", "template", with_={"template": "$x", "x": "${steps.a.output.nested.0}"}),
            step("h", "input", depends_on=["b"], timeout_s=60),
            step(
                "t",
                "sleep",
                with_={"seconds": 0.1},
                concurrency={"provider": "openai", "key": "k"},
                retry={"max_attempts": 4, "jitter": 0.25},
            ),
            throttle=[{"match": {"provider": "openai"}, "limit": 2}],
            inputs={"topic": "x", "n": [1, {"a": None}]},
            failure_policy="continue",
        )
    )
    limits = PipelineLimits(max_output_bytes=4096)
    plan = compile_data(data, limits)
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again == plan
    assert again.to_json() == text
    assert again.digest == plan.digest
    assert again.limits == limits
    assert again.step("t").throttle == ResolvedThrottle("openai/*/*/k", 2, 30.0)
    assert again.step("h").is_input
    assert Plan.from_json(text.encode()) == plan


def test_plan_json_is_canonical() -> None:
    plan = compile_data(pipeline(step("b", "echo", with_={}), step("a")))
    text = plan.to_json()
    assert text == json.dumps(
        json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert len(plan.digest) == 64


def test_the_digest_changes_when_the_plan_changes() -> None:
    one = compile_data(_with_alias(pipeline(step("a", "echo", with_={"value": 1}))))
    two = compile_data(_with_alias(pipeline(step("a", "echo", with_={"value": 2}))))
    assert one.digest != two.digest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("not json", "invalid plan JSON", id="not JSON"),
        pytest.param(
            '{"format": 1}', "invalid plan JSON: pipeline_id: field required", id="missing fields"
        ),
    ],
)
def test_from_json_rejects_malformed_plans(text: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        Plan.from_json(text)


def test_from_json_rejects_another_format_and_forward_dependencies() -> None:
    plan = compile_data(pipeline(step("a"), step("b", depends_on=["a"])))
    doc = json.loads(plan.to_json())
    with pytest.raises(ValueError, match="plan format 2 is not supported"):
        Plan.from_json(json.dumps({**doc, "format": 2}))
    doc["steps"].reverse()
    with pytest.raises(ValueError, match="step 'b' depends on 'a', which is not an earlier step"):
        Plan.from_json(json.dumps(doc))


def test_a_registry_decides_which_handlers_exist() -> None:
    registry = HandlerRegistry(autoload=False)
    registry.register("custom", lambda ctx: None)
    plan = compile_pipeline(parse_pipeline(pipeline(step("a", "custom"))), registry)
    assert plan.step("a").handler == "custom"
    with pytest.raises(PipelineError, match=r"unknown handler 'noop' \(known: custom\)"):
        compile_pipeline(parse_pipeline(pipeline(step("a", "noop"))), registry)


def test_a_50000_step_chain_compiles_without_recursion() -> None:
    n = 50_000
    steps = [{"id": "s0", "uses": "noop"}] + [
        {"id": f"s{i}", "uses": "echo", "with": {"v": f"${{steps.s{i - 1}.output}}"}}
        for i in range(1, n)
    ]
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(500)  # nothing may recurse per step
    try:
        plan = compile_data({"id": "chain", "steps": list(reversed(steps))})
    finally:
        sys.setrecursionlimit(old_limit)
    assert len(plan.steps) == n
    assert plan.steps[0].id == "s0" and plan.steps[-1].id == f"s{n - 1}"
    assert plan.step("s49999").deps == ("s49998",)
    assert Plan.from_json(plan.to_json()) == plan


def test_a_50000_step_cycle_is_found_without_recursion() -> None:
    n = 50_000
    steps = [{"id": f"s{i}", "uses": "noop", "depends_on": [f"s{(i + 1) % n}"]} for i in range(n)]
    message = problems_of({"id": "ring", "steps": steps})
    assert message.startswith("steps: dependency cycle s0 -> s1 -> ")


# --------------------------------------------------------------------------------------
# the Python builder
# --------------------------------------------------------------------------------------
def test_the_builder_makes_the_same_spec_as_a_document() -> None:
    p = Pipeline(id="files", inputs={"who": "world"})
    hello = p.step("hello", "template", with_={"template": "hi $who", "who": Pipeline.input("who")})
    p.step("shout", "echo", with_={"value": hello})
    assert isinstance(hello, StepRef) and isinstance(hello, str)
    assert hello == "${steps.hello.output}" and hello.step_id == "hello"
    assert hello.at("items", 0) == "${steps.hello.output.items.0}"
    assert p.build() == PipelineSpec.model_validate(DOC)


def test_the_builder_accepts_refs_in_depends_on_and_keyword_fields() -> None:
    p = Pipeline(id="b", defaults={"timeout_s": 5})
    a = p.step("a", "noop")
    p.step(
        "b",
        "fail",
        depends_on=[a],
        retry=RetryPolicy(max_attempts=3),
        concurrency={"provider": "x"},
    )
    plan = p.compile(REGISTRY)
    assert plan.step("b").deps == ("a",)
    assert plan.step("b").retry.max_attempts == 3
    assert plan.step("b").timeout_s == 5


def test_the_builder_reports_problems_like_files() -> None:
    p = Pipeline(id="b")
    p.step("a", "noop", retry={"max_attempts": 0})
    with pytest.raises(PipelineError) as info:
        p.build()
    assert str(info.value) == (
        "pipeline 'b': steps[0].retry.max_attempts: "
        "Input should be greater than or equal to 1 (value=0)"
    )


# --------------------------------------------------------------------------------------
# examples and packaging
# --------------------------------------------------------------------------------------
def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "summarize-documents.yaml",
        "retries.yaml",
        "throttled-provider.yaml",
        "human-input.yaml",
    }


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in EXAMPLES])
def test_every_example_compiles(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a platform defining the model provider the examples name (``local``)."""
    monkeypatch.setenv("AIRUNTIME_MODEL_PROVIDERS", '{"local": {"base_url": "http://m/v1"}}')
    plan = load_plan(path, registry=REGISTRY)
    assert plan.steps
    assert Plan.from_json(plan.to_json()) == plan


def test_summarize_documents_fans_out_and_in() -> None:
    plan = load_plan(EXAMPLE_DIR / "summarize-documents.yaml", registry=REGISTRY)
    summaries = [f"summarize_{i}" for i in range(8)]
    assert len(plan.step("split").inputs["value"]) == 8
    assert plan.step("split").children == tuple(summaries)
    for s in summaries:
        assert plan.step(s).deps == ("split",)
    assert plan.step("combine").deps == tuple(summaries)


def test_retries_example_allows_enough_attempts() -> None:
    step_ = load_plan(EXAMPLE_DIR / "retries.yaml", registry=REGISTRY).step("flaky")
    assert step_.handler == "fail"
    assert step_.inputs["fail_attempts"] == 2
    assert step_.retry.max_attempts == 4 and step_.retry.backoff_initial_s == 0.05


def test_throttled_provider_example_shares_one_scope() -> None:
    plan = load_plan(EXAMPLE_DIR / "throttled-provider.yaml", registry=REGISTRY)
    assert len(plan.steps) == 6 and all(not s.deps for s in plan.steps)
    assert {s.throttle for s in plan.steps} == {ResolvedThrottle("openai/gpt-x/chat", 2, 30.0)}


def test_human_input_example_waits_for_an_input_step() -> None:
    plan = load_plan(EXAMPLE_DIR / "human-input.yaml", registry=REGISTRY)
    assert plan.step("approve").is_input
    assert plan.step("publish").deps == ("draft", "approve")


def test_builtin_fallback_table_matches_pyproject_entry_points() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["airuntime.handlers"]
    assert declared == BUILTIN_ENTRY_POINTS


def test_without_a_registry_the_default_registry_is_used() -> None:
    plan = compile_pipeline(parse_pipeline(pipeline(step("a", "sleep"), step("b", "echo"))))
    assert [s.handler for s in plan.steps] == ["sleep", "echo"]


def test_a_handler_outside_the_tenants_allowlist_is_refused_naming_step_and_list() -> None:
    call = {"callable": "tests.engine.callables:add"}
    b = step("b", "python", **{"with": call})
    spec = parse_pipeline(pipeline(step("a", "echo"), b, step("c", "sleep")))
    with pytest.raises(PipelineError) as info:
        compile_pipeline(spec, REGISTRY, allowed_handlers=["echo", "sleep"])
    assert str(info.value) == (
        "steps[1].uses: handler 'python' is not allowed for this tenant (allowed: echo, sleep)"
    )
    # no allowlist: the registry (and the platform's python modules) decide
    assert compile_pipeline(spec, REGISTRY, python_modules=["tests.engine.callables"]).steps


def _wide(n: int) -> Plan:
    """root -> n steps: n * ~240 bytes of plan JSON."""
    steps = [step("root")] + [step(f"s{i}", depends_on=["root"]) for i in range(n)]
    return compile_data(pipeline(*steps))


def test_a_small_plan_is_stored_as_its_canonical_json() -> None:
    plan = _wide(3)
    assert plan.stored() == plan.to_json()
    assert plan_json_of(plan.stored()) == plan.to_json()
    assert plan_json_of(plan.to_json().encode()) == plan.to_json()


def test_a_large_plan_is_stored_compressed_and_read_back_as_the_same_plan() -> None:
    plan = _wide(1000)
    text = plan.to_json()
    assert len(text) > COMPRESS_ABOVE_BYTES
    stored = plan.stored()
    assert isinstance(stored, bytes) and stored.startswith(COMPRESSED_PREFIX)
    assert len(stored) < len(text) / 10
    assert plan_json_of(stored) == text
    again = Plan.from_json(stored)
    assert again == plan and again.digest == plan.digest
    # The digest is the canonical JSON's, whichever form is stored.
    assert plan.digest == hashlib.sha256(text.encode()).hexdigest()


def test_a_damaged_or_unbounded_compressed_plan_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = _wide(1000).stored()
    assert isinstance(stored, bytes)
    with pytest.raises(ValueError, match="damaged compressed data"):
        plan_json_of(COMPRESSED_PREFIX + b"not zlib at all")
    with pytest.raises(ValueError, match="truncated"):
        plan_json_of(stored[: len(stored) // 2])
    monkeypatch.setattr(plan_module, "MAX_PLAN_JSON_BYTES", 10_000)
    bomb = COMPRESSED_PREFIX + zlib.compress(b" " * 10_001, 9)
    with pytest.raises(ValueError, match="beyond 10000 bytes"):
        plan_json_of(bomb)
    assert plan_json_of(COMPRESSED_PREFIX + zlib.compress(b"{}" * 5_000)) == "{}" * 5_000
    with pytest.raises(ValueError, match="damaged compressed data"):
        Plan.from_json(COMPRESSED_PREFIX + b"\x78\x01garbage")
