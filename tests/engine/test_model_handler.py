"""``model`` steps call the providers the platform defines, and nothing else, against a real
HTTP server speaking OpenAI's and Anthropic's APIs: what is sent (the key added by the
runtime, never written in the pipeline), what a step's output is, which failures are
retried, and what is refused when the pipeline is submitted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import StepContext, StepFailed, TransientError
from airuntime.engine.handlers.model_call import model_call
from airuntime.engine.handlers.reply_schema import UnusableSchema, reply_problem, schema_problem
from airuntime.engine.handlers.retry_after import retry_after_s
from airuntime.engine.handlers.settings import HandlerSettings
from airuntime.engine.pipeline import PipelineError, compile_pipeline, parse_pipeline
from airuntime.engine.pipeline.plan_cache import PlanCache
from airuntime.engine.worker_pool import WorkerPool
from tests.engine.model_server import ModelServer, model_server, openai_text

PROVIDERS = "AIRUNTIME_MODEL_PROVIDERS"
KEY_ENV = "TEST_MODEL_KEY"
KEY = "sk-test-5e1c2a9b7d"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    """The server, defined as three providers: ``gpt`` (OpenAI API, a key, two models),
    ``claude`` (Anthropic API, a key, 512 output tokens at most), ``local`` (OpenAI API,
    no key, any model)."""
    with model_server() as s:
        providers = {
            "gpt": {
                "base_url": s.openai_url,
                "api_key_env": KEY_ENV,
                "models": ["gpt-small", "gpt-large"],
                "headers": {"OpenAI-Organization": "org-1"},
            },
            "claude": {
                "api": "anthropic",
                "base_url": s.anthropic_url,
                "api_key_env": KEY_ENV,
                "max_output_tokens": 512,
            },
            "local": {"base_url": s.openai_url + "/", "timeout_s": 5},
        }
        monkeypatch.setenv(PROVIDERS, json.dumps(providers))
        monkeypatch.setenv(KEY_ENV, KEY)
        yield s


def ctx(inputs: Any, attempt: int = 1) -> StepContext:
    return StepContext(
        execution_id="e", step_id="ask", attempt=attempt, inputs=inputs, pipeline_id="p"
    )


async def test_an_openai_call_sends_the_platforms_key_and_answers_one_shape(
    server: ModelServer,
) -> None:
    out = await model_call(
        ctx(
            {
                "provider": "gpt",
                "model": "gpt-small",
                "system": "Be brief.",
                "prompt": "Summarise the report",
                "max_tokens": 64,
                "temperature": 0,
                "stop": "END",
                "seed": 7,
            }
        )
    )
    assert out == {
        "text": "echo: Summarise the report",
        "provider": "gpt",
        "model": "gpt-small-2026",
        "finish_reason": "stop",
        "usage": {"input_tokens": 5, "output_tokens": 4},
    }
    (seen,) = server.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["Authorization"] == f"Bearer {KEY}"
    assert seen.headers["OpenAI-Organization"] == "org-1"
    assert seen.body == {
        "model": "gpt-small",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Summarise the report"},
        ],
        "max_tokens": 64,
        "temperature": 0.0,
        "stop": ["END"],
        "seed": 7,
    }


async def test_an_anthropic_call_speaks_the_messages_api(server: ModelServer) -> None:
    out = await model_call(
        ctx(
            {
                "provider": "claude",
                "model": "claude-x",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "one"},
                    {"role": "assistant", "content": "two"},
                    {"role": "user", "content": {"n": 3}},
                ],
                "stop": ["END", "STOP"],
            }
        )
    )
    assert out["text"] == 'echo: {"n":3}' and out["finish_reason"] == "end_turn"
    assert out["usage"] == {"input_tokens": 1, "output_tokens": 2}
    (seen,) = server.seen
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == KEY and seen.headers["anthropic-version"]
    assert "Authorization" not in seen.headers
    assert seen.body == {
        "model": "claude-x",
        "max_tokens": 512,  # no max_tokens given: min(1024, the provider's cap)
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": '{"n":3}'},
        ],
        "stop_sequences": ["END", "STOP"],
    }


async def test_a_provider_without_a_key_gets_no_credentials(server: ModelServer) -> None:
    out = await model_call(ctx({"provider": "local", "model": "llama", "prompt": "hi"}))
    assert out["text"] == "echo: hi"
    (seen,) = server.seen
    assert seen.path == "/v1/chat/completions"  # the trailing '/' of base_url dropped
    assert "Authorization" not in seen.headers and seen.body["max_tokens"] == 1024


async def test_output_json_parses_the_reply(server: ModelServer) -> None:
    server.answers.append((200, openai_text('{"verdict": "ok", "score": 3}')))
    out = await model_call(
        ctx({"provider": "local", "model": "m", "prompt": "judge", "output": "json"})
    )
    assert out["json"] == {"verdict": "ok", "score": 3}
    server.answers.append((200, openai_text("Sure! Here it is: {")))
    with pytest.raises(TransientError, match="reply is not JSON"):
        await model_call(
            ctx({"provider": "local", "model": "m", "prompt": "judge", "output": "json"})
        )


@pytest.mark.parametrize(
    ("status", "body", "error", "fragment"),
    [
        pytest.param(429, {"error": {"message": "Rate limit reached"}}, TransientError,
                     "HTTP 429: Rate limit reached", id="429"),
        pytest.param(500, "upstream exploded", TransientError, "HTTP 500: upstream exploded",
                     id="500"),
        pytest.param(529, {"error": {"type": "overloaded_error", "message": "Overloaded"}},
                     TransientError, "HTTP 529: Overloaded", id="529-overloaded"),
        pytest.param(400, {"error": {"message": "max_tokens is too large"}}, StepFailed,
                     "HTTP 400: max_tokens is too large", id="400"),
        pytest.param(404, {"error": {"message": "The model does not exist"}}, StepFailed,
                     "HTTP 404: The model does not exist", id="404"),
        pytest.param(200, {"unexpected": True}, TransientError, "is not a openai answer",
                     id="not-an-answer"),
        pytest.param(200, "<html>gateway</html>", TransientError, "gateway", id="not-json"),
    ],
)  # fmt: skip
async def test_failures_are_sorted_into_retry_and_give_up(
    server: ModelServer, status: int, body: Any, error: type[Exception], fragment: str
) -> None:
    server.answers.append((status, body))
    with pytest.raises(error) as info:
        await model_call(ctx({"provider": "gpt", "model": "gpt-small", "prompt": "hi"}))
    message = str(info.value)
    assert fragment in message and "provider 'gpt' model 'gpt-small'" in message
    assert isinstance(info.value, StepFailed) == (error is StepFailed)


async def test_refused_credentials_are_never_quoted(server: ModelServer) -> None:
    """A provider that echoes the key in its 401 (some do, masked or not) does not get it
    into the step's error, which every reader of the run sees."""
    server.answers.append((401, {"error": {"message": f"Incorrect API key provided: {KEY}"}}))
    with pytest.raises(StepFailed) as info:
        await model_call(ctx({"provider": "gpt", "model": "gpt-small", "prompt": "hi"}))
    assert "refused the platform's credentials" in str(info.value)
    assert KEY not in str(info.value)
    server.answers.append((400, {"error": {"message": f"bad request for key {KEY}"}}))
    with pytest.raises(StepFailed) as info:
        await model_call(ctx({"provider": "gpt", "model": "gpt-small", "prompt": "hi"}))
    assert KEY not in str(info.value) and "***" in str(info.value)


async def test_a_missing_key_variable_fails_naming_it(
    server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(StepFailed, match=f"key variable {KEY_ENV} is not set on this runtime"):
        await model_call(ctx({"provider": "gpt", "model": "gpt-small", "prompt": "hi"}))
    assert server.seen == []


async def test_an_unreachable_provider_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv(PROVIDERS, json.dumps({"gone": {"base_url": f"http://127.0.0.1:{port}"}}))
    with pytest.raises(TransientError, match=r"provider 'gone': POST .*ConnectError"):
        await model_call(ctx({"provider": "gone", "model": "m", "prompt": "hi"}))


JSON_ASK: dict[str, Any] = {
    "provider": "gpt",
    "model": "gpt-small",
    "prompt": "x",
    "output": "json",
}
VERDICT: dict[str, Any] = {
    "type": "object",
    "required": ["verdict", "score"],
    "properties": {
        "verdict": {"enum": ["ok", "revise"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "additionalProperties": False,
}


def pipeline(**with_: Any) -> dict[str, Any]:
    return {"id": "p", "steps": [{"id": "ask", "uses": "model", "with": with_}]}


@pytest.mark.parametrize(
    ("with_", "field", "fragment"),
    [
        pytest.param({"provider": "nope", "model": "m", "prompt": "x"}, "provider",
                     "unknown provider 'nope'; the platform defines: claude, gpt, local",
                     id="unknown-provider"),
        pytest.param({"provider": "${inputs.p}", "model": "m", "prompt": "x"}, "provider",
                     "must be written out, not a reference", id="provider-reference"),
        pytest.param({"provider": "gpt", "model": "gpt-huge", "prompt": "x"}, "model",
                     "'gpt-huge' is not offered by provider 'gpt' (gpt-small, gpt-large)",
                     id="model-not-offered"),
        pytest.param({"provider": "gpt", "prompt": "x"}, "model", "is required",
                     id="no-model"),
        pytest.param({"provider": "local", "model": "m" * 257, "prompt": "x"}, "model",
                     "must be a string of 1 to 256 characters", id="model-name-too-long"),
        pytest.param({"provider": "gpt", "model": "gpt-small"}, "prompt",
                     "exactly one of prompt and messages", id="no-prompt"),
        pytest.param({"provider": "gpt", "model": "gpt-small", "prompt": "x",
                      "messages": [{"role": "user", "content": "y"}]}, "prompt",
                     "exactly one of prompt and messages", id="both"),
        pytest.param({"provider": "gpt", "model": "gpt-small",
                      "messages": [{"role": "tool", "content": "y"}]}, "messages[0].role",
                     "must be one of system, user, assistant (value='tool')", id="role"),
        pytest.param({"provider": "claude", "model": "c", "prompt": "x", "max_tokens": 513},
                     "max_tokens", "from 1 to 512 (value=513)", id="over-the-cap"),
        pytest.param({"provider": "gpt", "model": "gpt-small", "prompt": "x",
                      "temperature": 3}, "temperature", "from 0 to 2 (value=3)",
                     id="temperature"),
        pytest.param({"provider": "claude", "model": "c", "prompt": "x", "seed": 1}, "seed",
                     "provider 'claude' (anthropic API) takes no seed", id="seed-anthropic"),
        pytest.param({"provider": "gpt", "model": "gpt-small", "prompt": "x",
                      "output": "yaml"}, "output", "must be text or json (value='yaml')",
                     id="output"),
        pytest.param({"provider": "gpt", "model": "gpt-small", "prompt": "x",
                      "url": "http://169.254.169.254/"}, "url", "unknown field(s) url",
                     id="unknown-field"),
        pytest.param({"provider": "gpt", "model": "gpt-small", "prompt": "x",
                      "stop": ["a", "b", "c", "d", "e"]}, "stop", "1 to 4 non-empty strings",
                     id="stop"),
        pytest.param({"provider": "gpt", "model": "gpt-small", "prompt": "x",
                      "schema": {"type": "object"}}, "schema", "needs output: json",
                     id="schema-without-json"),
        pytest.param({**JSON_ASK, "schema": ["object"]}, "schema",
                     "must be a JSON Schema object", id="schema-not-a-mapping"),
        pytest.param({**JSON_ASK, "schema": {"type": "objekt"}}, "schema",
                     "is not a valid JSON Schema at type", id="schema-invalid"),
        pytest.param({**JSON_ASK, "schema": {"properties": {"a": {"minLength": -1}}}},
                     "schema", "is not a valid JSON Schema at properties.a.minLength",
                     id="schema-invalid-nested"),
        pytest.param({**JSON_ASK, "schema": {"properties": {"id": {"pattern": "^(a+)+$"}}}},
                     "schema", "'pattern' (at properties.id) is not supported: a regular "
                     "expression would run on the model's reply", id="schema-pattern"),
        pytest.param({**JSON_ASK, "schema": {"patternProperties": {"x": {}}}}, "schema",
                     "'patternProperties' is not supported", id="schema-pattern-properties"),
        pytest.param({**JSON_ASK, "schema": {"$ref": "https://example.com/s.json"}}, "schema",
                     "$ref must be a JSON pointer inside the schema ('#/...'), not "
                     "'https://example.com/s.json'", id="schema-remote-ref"),
        pytest.param({**JSON_ASK, "schema": {"properties": {"a": {"$ref": "#/$defs/gone"}}}},
                     "schema", "$ref (at properties.a) '#/$defs/gone' points at nothing",
                     id="schema-dangling-ref"),
        pytest.param({**JSON_ASK, "schema": {"$schema": "https://example.com/mine"}}, "schema",
                     "$schema 'https://example.com/mine' is not a JSON Schema draft",
                     id="schema-unknown-draft"),
        pytest.param({**JSON_ASK, "schema": {"$schema": ["x"]}}, "schema",
                     "$schema \"['x']\" is not a JSON Schema draft", id="schema-draft-not-text"),
        pytest.param({**JSON_ASK, "schema": {"enum": [{"pattern": "^(a+)+$"}],
                                              "description": "${inputs.d}"}}, "schema",
                     "must be written out, not name a step output or run input ('${inputs.d}')",
                     id="schema-reference"),
    ],
)  # fmt: skip
def test_a_call_the_platform_does_not_offer_is_refused_at_submit(
    server: ModelServer, with_: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(PipelineError) as info:
        compile_pipeline(parse_pipeline(pipeline(**with_)))
    message = str(info.value)
    assert f"steps[0].with.{field}: step 'ask'" in message, message
    assert fragment in message, message
    assert server.seen == []


def test_with_no_providers_defined_every_model_step_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PROVIDERS, raising=False)
    with pytest.raises(PipelineError) as info:
        compile_pipeline(parse_pipeline(pipeline(provider="gpt", model="m", prompt="x")))
    assert "the platform defines none (AIRUNTIME_MODEL_PROVIDERS is unset)" in str(info.value)


def test_a_model_step_is_throttled_by_its_provider(server: ModelServer) -> None:
    """The step's provider and model are what it consumes: ``throttle`` rules naming them
    apply without a ``concurrency`` of the step's own (which, given, wins)."""
    doc = {
        "id": "p",
        "throttle": [{"match": {"provider": "gpt"}, "limit": 2}],
        "steps": [
            {"id": "a", "uses": "model", "with": {"provider": "gpt", "model": "gpt-small",
                                                  "prompt": "x"}},
            {"id": "b", "uses": "model", "with": {"provider": "local", "model": "m",
                                                  "prompt": "x"}},
            {"id": "c", "uses": "model", "with": {"provider": "local", "model": "m",
                                                  "prompt": "x"},
             "concurrency": {"provider": "gpt", "key": "shared"}},
        ],
    }  # fmt: skip
    plan = compile_pipeline(parse_pipeline(doc))
    steps = {s.id: s for s in plan.steps}
    assert steps["a"].throttle is not None and steps["a"].throttle.limit == 2
    assert steps["a"].throttle.scope == "gpt/gpt-small/chat"
    assert steps["b"].throttle is None
    assert steps["c"].throttle is not None and steps["c"].throttle.scope == "gpt/*/*/shared"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("{not json", "is not JSON"),
        ('["a"]', "must be a JSON object"),
        ('{"Bad Name": {"base_url": "http://x"}}', "provider name 'Bad Name'"),
        ('{"p": {"base_url": "file:///etc/passwd"}}', "must be an http:// or https:// URL"),
        ('{"p": {"base_url": "https://u:pw@x"}}', "must not carry credentials"),
        ('{"p": {"base_url": "https://x", "api_key_env": "AIRUNTIME_RUNTIME_TOKEN"}}',
         "an AIRUNTIME_ variable is never sent to a provider"),
        ('{"p": {"base_url": "https://x", "headers": {"Authorization": "Bearer k"}}}',
         "carries credentials: use api_key_env"),
        ('{"p": {"base_url": "https://x", "api": "gemini"}}', "provider 'p': api:"),
        ('{"p": {"base_url": "https://x", "max_output_tokens": 0}}', "max_output_tokens"),
        ('{"p": {"base_url": "https://x", "key": "sk-inline"}}', "provider 'p': key:"),
    ],
)  # fmt: skip
def test_the_platforms_provider_setting_is_checked(
    monkeypatch: pytest.MonkeyPatch, value: str, fragment: str
) -> None:
    monkeypatch.setenv(PROVIDERS, value)
    with pytest.raises(ValidationError) as info:
        HandlerSettings()
    assert fragment in str(info.value)


async def test_a_pipeline_of_model_steps_runs_and_keeps_no_key(
    server: ModelServer, redis: Redis
) -> None:
    """End to end on Valkey: one step's reply is the next one's prompt, a rate limit is
    retried by the step's policy, and the key is nowhere in what the run keeps."""
    doc = {
        "id": "p",
        "steps": [
            {"id": "draft", "uses": "model",
             "with": {"provider": "gpt", "model": "gpt-small", "prompt": "the plan"}},
            {"id": "review", "uses": "model",
             "with": {"provider": "claude", "model": "c",
                      "prompt": "Review: ${steps.draft.output.text}"},
             "retry": {"max_attempts": 3, "backoff_initial_s": 0.01, "jitter": 0}},
        ],
    }  # fmt: skip
    store = ExecutionStore(redis)
    eid = await store.create(compile_pipeline(parse_pipeline(doc)))
    server.answers.append((200, openai_text("a draft")))  # for the draft
    server.answers.append((429, {"error": {"message": "slow down"}}))  # the review, once
    assert await WorkerPool(store).run(eid) == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["steps"]["review"]["output"]["text"] == "echo: Review: a draft"
    assert snap["steps"]["review"]["attempts"] == 2
    assert [s.path for s in server.seen] == ["/v1/chat/completions", "/v1/messages", "/v1/messages"]
    kept = json.dumps(snap) + repr(await store.events(eid))
    assert KEY not in kept and "slow down" in kept


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        pytest.param('{"verdict": "ok", "score": 3}', None, id="matches"),
        pytest.param('{"verdict": "fine", "score": 3}', "['verdict']: 'fine' is not one of "
                     "['ok', 'revise']", id="enum"),
        pytest.param('{"verdict": "ok", "score": 11}', "['score']: 11 is greater than the "
                     "maximum of 10", id="maximum"),
        pytest.param('{"verdict": "ok"}', "the reply: 'score' is a required property",
                     id="missing"),
        pytest.param('{"verdict": "ok", "score": 1, "x": 0, "y": 0}', "the reply: Additional "
                     "properties are not allowed", id="extra"),
        pytest.param('["ok", 3]', "the reply: ['ok', 3] is not of type 'object'", id="type"),
        pytest.param("[" * 5000 + "]" * 5000, "reply is not JSON", id="too-deep"),
    ],
)  # fmt: skip
async def test_a_json_reply_is_checked_against_the_steps_schema(
    server: ModelServer, reply: str, problem: str | None
) -> None:
    server.answers.append((200, openai_text(reply)))
    call = ctx({**JSON_ASK, "schema": VERDICT})
    if problem is None:
        assert (await model_call(call))["json"] == json.loads(reply)
        return
    with pytest.raises(TransientError) as info:
        await model_call(call)
    assert problem in str(info.value), str(info.value)


async def test_a_reply_off_its_schema_is_retried_then_fails_naming_the_mismatch(
    server: ModelServer, redis: Redis
) -> None:
    """End to end: the first reply misses a field (retried), the second matches and is
    what the next step reads; a step whose every reply misses fails naming where."""
    doc = {
        "id": "p",
        "steps": [
            {"id": "judge", "uses": "model", "with": {**JSON_ASK, "schema": VERDICT},
             "retry": {"max_attempts": 2, "backoff_initial_s": 0.01, "jitter": 0}},
            {"id": "use", "uses": "echo", "with": {"value": "${steps.judge.output.json.score}"}},
        ],
    }  # fmt: skip
    store = ExecutionStore(redis)
    eid = await store.create(compile_pipeline(parse_pipeline(doc)))
    server.answers.append((200, openai_text('{"verdict": "ok"}')))
    server.answers.append((200, openai_text('{"verdict": "revise", "score": 4}')))
    assert await WorkerPool(store).run(eid) == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["steps"]["judge"]["attempts"] == 2 and snap["steps"]["use"]["output"] == 4
    eid = await store.create(compile_pipeline(parse_pipeline(doc)))
    server.answers.extend([(200, openai_text('{"verdict": "ok"}'))] * 2)
    assert await WorkerPool(store).run(eid) == "Failed"
    snap = await store.snapshot(eid)
    assert snap is not None
    error = snap["steps"]["judge"]["error"]
    assert "does not match the step's schema: the reply: 'score' is a required" in error
    assert snap["steps"]["use"]["status"] == "skipped"


def test_the_packaged_example_runs_with_airt_run(server: ModelServer) -> None:
    """``airt run model-review`` as a user runs it: the embedded Valkey, a provider named
    ``local`` defined in the environment, the example's two calls in order, the review
    parsed as JSON."""
    server.answers.append((200, openai_text("Launch on Monday. Two features. One fix.")))
    server.answers.append((200, openai_text('{"approved": true, "reason": "clear"}')))
    providers = json.dumps({"local": {"base_url": server.openai_url}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    result = subprocess.run(
        [sys.executable, "-m", "airuntime.cli", "run", "model-review", "--json",
         "--input", "topic=the launch"],
        env={**env, "AIRUNTIME_MODEL_PROVIDERS": providers},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["status"] == "Succeeded"
    assert snapshot["steps"]["review"]["output"]["json"] == {"approved": True, "reason": "clear"}
    draft, review = server.seen
    assert draft.body["messages"][1]["content"].endswith("about the launch.")
    assert review.body["messages"][1]["content"] == (
        "Review this announcement: Launch on Monday. Two features. One fix."
    )
    # The step table shows what the model said, not the reply's envelope.
    server.answers.append((200, openai_text("Launch on Monday. Two features. One fix.")))
    server.answers.append((200, openai_text('{"approved": false, "reason": "vague"}')))
    table = subprocess.run(
        [sys.executable, "-m", "airuntime.cli", "run", "model-review"],
        env={**env, "AIRUNTIME_MODEL_PROVIDERS": providers, "COLUMNS": "200"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert table.returncode == 0, table.stdout + table.stderr
    assert "Launch on Monday. Two features. One fix." in table.stdout
    assert '{"approved": false, "reason": "vague"}' in table.stdout
    assert "finish_reason" not in table.stdout, table.stdout


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"}, 30.0),
        ({"Retry-After": "Wed, 21 Oct 2015 07:27:00 GMT"}, 0.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-3"}, None),
        ({"Retry-After": "nan"}, None),
        ({}, None),
    ],
)
def test_retry_after_reads_seconds_milliseconds_and_dates(
    headers: dict[str, str], expected: float | None
) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert retry_after_s(httpx.Headers(headers), now=now) == expected


async def test_a_rate_limited_step_waits_as_long_as_the_provider_asked(
    server: ModelServer, redis: Redis
) -> None:
    """The retry of a 429 with ``Retry-After: 1`` is scheduled a second later although the
    step's own backoff is 10 ms (read from the ledger: Redis time at the failure and the
    retry's due time), and then succeeds."""
    doc = pipeline(provider="gpt", model="gpt-small", prompt="hi")
    doc["steps"][0]["retry"] = {"max_attempts": 2, "backoff_initial_s": 0.01, "jitter": 0}
    store = ExecutionStore(redis)
    eid = await store.create(compile_pipeline(parse_pipeline(doc)))
    server.answers.append((429, {"error": {"message": "slow down"}}, {"Retry-After": "1"}))
    assert await WorkerPool(store).run(eid) == "Succeeded"
    (scheduled,) = [e for e in await store.events(eid) if e.type == "step_retry_scheduled"]
    failed_at_ms = int(scheduled.id.split("-")[0])
    assert int(scheduled.fields["next_retry_at"]) - failed_at_ms >= 1000


async def test_the_http_handler_passes_retry_after_on_too(
    server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airuntime.engine.handlers.builtin import http_request

    monkeypatch.setenv("AIRUNTIME_HTTP_HANDLER_ALLOW", "127.0.0.1")
    server.answers.append((503, "busy", {"Retry-After": "4"}))
    url = f"{server.openai_url}/chat/completions"
    with pytest.raises(TransientError, match="HTTP 503: busy") as info:
        await http_request(ctx({"method": "POST", "url": url, "json": {}}))
    assert info.value.retry_after_s == 4.0


def test_a_tenant_may_be_limited_to_some_providers(server: ModelServer) -> None:
    doc = pipeline(provider="gpt", model="gpt-small", prompt="x")
    assert compile_pipeline(parse_pipeline(doc), allowed_model_providers=["gpt", "local"])
    for allowed, granted in ((["local"], "(local)"), ([], "(none)")):
        with pytest.raises(PipelineError) as info:
            compile_pipeline(parse_pipeline(doc), allowed_model_providers=allowed)
        assert f"provider 'gpt' is not allowed for this tenant {granted}" in str(info.value)
    # The plan cache keeps one verdict per allowlist, never another tenant's.
    cache = PlanCache()
    assert cache.compile(doc, allowed_model_providers=("gpt",))
    with pytest.raises(PipelineError, match="not allowed for this tenant"):
        cache.compile(doc, allowed_model_providers=("local",))
    assert cache.compile(doc) is cache.compile(doc, allowed_model_providers=None)


async def test_a_runtimes_metrics_count_each_tenants_calls_and_tokens(server: ModelServer) -> None:
    """``/metrics`` of a runtime host: calls by outcome and tokens by direction, per
    tenant, provider and the model the provider reported; failed calls under ``-``, so
    made-up model names add no series."""
    from prometheus_client import generate_latest

    from runtime_pod.metrics import RuntimeMetrics

    tenant = f"t-{os.urandom(4).hex()}"

    def as_tenant(with_: dict[str, Any]) -> StepContext:
        return StepContext(
            execution_id="e", step_id="s", attempt=1, inputs=with_, pipeline_id="p",
            tenant_id=tenant,
        )  # fmt: skip

    for prompt in ("one two", "three"):
        await model_call(as_tenant({"provider": "gpt", "model": "gpt-small", "prompt": prompt}))
    server.answers.append((429, {"error": {"message": "slow"}}))
    server.answers.append((404, {"error": {"message": "no such model"}}))
    for _ in range(2):
        with pytest.raises((TransientError, StepFailed)):
            await model_call(as_tenant({"provider": "local", "model": "made-up", "prompt": "x"}))
    text = generate_latest(RuntimeMetrics().registry).decode()
    mine = {
        line.rsplit(" ", 1)[0].replace(f',tenant="{tenant}"', ""): float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if f'tenant="{tenant}"' in line
    }
    calls, tokens = "airuntime_model_calls_total", "airuntime_model_tokens_total"
    assert mine == {
        f'{calls}{{model="gpt-small-2026",outcome="ok",provider="gpt"}}': 2,
        f'{calls}{{model="-",outcome="retried",provider="local"}}': 1,
        f'{calls}{{model="-",outcome="failed",provider="local"}}': 1,
        f'{tokens}{{direction="input",model="gpt-small-2026",provider="gpt"}}': 3,
        f'{tokens}{{direction="output",model="gpt-small-2026",provider="gpt"}}': 5,
    }, text


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
_LONG = st.text(min_size=200, max_size=400)
_VALUE = _JSON | _LONG | st.sampled_from(["${inputs.x}", "${steps.a.output}", "", "json"])
_FIELDS = st.sampled_from(["provider", "model", "prompt", "system", "messages", "max_tokens",
                           "temperature", "stop", "seed", "output", "url"])  # fmt: skip


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    provider=st.sampled_from(["gpt", "claude", "local"]) | _VALUE,
    model=st.sampled_from(["gpt-small", "m"]) | _VALUE,
    prompt=st.just("hi") | _VALUE,
    extra=st.dictionaries(_FIELDS, _VALUE, max_size=4),
)
def test_any_with_of_a_model_step_compiles_or_is_refused_naming_fields(
    server: ModelServer, provider: Any, model: Any, prompt: Any, extra: dict[str, Any]
) -> None:
    """Whatever a tenant writes under ``with``, submit answers a plan or problems that
    name ``steps[0].with...``: never another exception (a 500)."""
    with_ = {"provider": provider, "model": model, "prompt": prompt, **extra}
    try:
        compile_pipeline(parse_pipeline(pipeline(**with_)))
    except PipelineError as exc:
        assert all(p.loc.startswith("steps[0].with") for p in exc.problems), exc.problems


KEYWORDS = st.sampled_from(
    ["type", "properties", "required", "items", "enum", "const", "$ref", "$defs", "$schema",
     "anyOf", "oneOf", "not", "minimum", "maxLength", "additionalProperties", "pattern",
     "$dynamicRef", "description", "default", "x"]
)  # fmt: skip
SCHEMA_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(
        ["object", "string", "integer", "#", "#/$defs/a", "#/properties/a", "#a",
         "https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/draft-07/schema#",
         "${inputs.x}", "", "a"]
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYWORDS | st.just("a"), inner,
                                                               max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(
    schema=st.dictionaries(KEYWORDS, SCHEMA_VALUES, min_size=1, max_size=5),
    reply=SCHEMA_VALUES,
)
def test_any_schema_is_refused_or_applied_never_crashing(
    schema: dict[str, Any], reply: Any
) -> None:
    """Whatever a pipeline writes as ``schema``: a refusal (a 422 at submit), or a schema
    that checks any reply into a mismatch, a match or an UnusableSchema (the step fails
    naming it): never another exception (a 500 at submit, a crashed attempt)."""
    problem = schema_problem(schema)
    if problem is not None:
        assert isinstance(problem, str) and problem
        return
    try:
        found = reply_problem(schema, reply)
    except UnusableSchema as exc:
        assert "schema" in str(exc)
        return
    assert found is None or isinstance(found, str)


async def test_a_schema_that_cannot_be_applied_fails_the_step_without_retrying(
    server: ModelServer,
) -> None:
    """A schema that refers to itself without end passes the submit's checks and still
    cannot check a reply: the step fails (a retry would call the model again for
    nothing), naming the schema, not the reply."""
    server.answers.append((200, openai_text('{"a": 1}')))
    with pytest.raises(StepFailed, match="the schema refers to itself without end"):
        await model_call(ctx({**JSON_ASK, "schema": {"$ref": "#"}}))
