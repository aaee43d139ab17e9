"""The ``model`` handler: one call to a language model of a provider the platform offers.

Why this module exists: calling a model is what most steps of an AI workflow do, and
doing it through ``http`` would put a provider's URL and key into the pipeline (so into
the run's record, ledger and history, readable by anyone who can read the run) and
leave every pipeline to parse two vendors' replies and sort their errors into "retry"
and "give up". A ``model`` step names a provider of ``AIRUNTIME_MODEL_PROVIDERS``
(:mod:`~airuntime.engine.handlers.model_providers`) and a model; the runtime adds the
key, speaks the provider's API and answers one shape::

    - id: summarise
      uses: model
      with:
        provider: openai            # a provider the platform defines (written out)
        model: gpt-4o-mini          # one of its models (written out)
        system: You write one-sentence summaries.
        prompt: "Summarise: ${steps.fetch.output.text}"   # or messages: [{role, content}]
        max_tokens: 200             # at most the provider's max_output_tokens
        temperature: 0              # optional; so are stop, seed (openai) and output
        output: json                # optional: the reply parsed as JSON, as output.json
        schema: {type: object, required: [verdict]}   # optional, with output: json

    output: {"text": "...", "provider": "openai", "model": "gpt-4o-mini-2024-07-18",
             "finish_reason": "stop", "usage": {"input_tokens": 31, "output_tokens": 12}}

The same checks run when the pipeline is submitted (:func:`call_problems` with the
values written in it: the provider and model must be written out, not references, so a
pipeline that names what the platform does not offer is refused before anything is
stored) and when the step runs (with the references resolved). A ``prompt``, ``system``
or message content that resolves to something other than text is sent as its JSON.

Failures: a network error, a timeout, HTTP 408/409/425/429, 5xx and Anthropic's 529 are
:class:`~airuntime.engine.handlers.TransientError` (the step's retry policy decides, and
the retry waits at least what the provider's ``Retry-After`` asked);
a reply that ``output: json`` cannot parse, or that does not match the step's ``schema``
(:mod:`~airuntime.engine.handlers.reply_schema`), is too (a retry may answer better). Any other
4xx is :class:`~airuntime.engine.handlers.StepFailed` with the provider's message; 401
and 403 say the platform's credentials were refused and never quote the reply. The key
is read from the runtime's environment for each call and never appears in an output or
an error. Each call is counted for the process's metrics
(:mod:`~airuntime.engine.handlers.model_usage`).

Budget: when the run's tenant has a ``model_token_budget``, the call first reserves its
``max_tokens`` of it and afterwards settles with the tokens the provider reported
(:mod:`~airuntime.engine.model_budget`); a budget without room fails the step, naming
it, and the call is not made.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from airuntime.engine.handlers import StepContext, StepFailed, TransientError
from airuntime.engine.handlers.model_providers import (
    ModelApi,
    ModelProvider,
    describe_providers,
)
from airuntime.engine.handlers.model_usage import CallOutcome, record_call, token_count
from airuntime.engine.handlers.reply_schema import UnusableSchema, reply_problem, schema_problem
from airuntime.engine.handlers.retry_after import retry_after_s
from airuntime.engine.handlers.settings import handler_settings
from airuntime.engine.model_budget import BudgetSpent

if TYPE_CHECKING:
    import httpx

__all__ = ["MODEL_HANDLER", "ModelRequest", "call_problems", "model_call", "parse_request"]

MODEL_HANDLER: Final = "model"

FIELDS: Final = (
    "provider",
    "model",
    "prompt",
    "system",
    "messages",
    "max_tokens",
    "temperature",
    "stop",
    "seed",
    "output",
    "schema",
)
ROLES: Final = ("system", "user", "assistant")
OUTPUTS: Final = ("text", "json")
MAX_STOP: Final = 4
MAX_NAME: Final = 256
ANTHROPIC_VERSION: Final = "2023-06-01"
_RETRYABLE: Final = frozenset({408, 409, 425, 429, 529})
_QUOTED: Final = 300


@dataclass(frozen=True)
class ModelRequest:
    """One call, checked: what :func:`model_call` sends."""

    provider_name: str
    provider: ModelProvider
    model: str
    system: str | None
    messages: tuple[tuple[str, str], ...]
    """(role, content), in order; the ``prompt`` form is one user message."""
    max_tokens: int
    temperature: float | None
    stop: tuple[str, ...]
    seed: int | None
    output: str
    schema: Mapping[str, Any] | None = None
    """What a JSON reply must match (:mod:`~airuntime.engine.handlers.reply_schema`)."""


def _shown(value: object, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters, for a refusal (a value may be long)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _is_reference(value: object) -> bool:
    return isinstance(value, str) and "${" in value


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


class _Reader:
    """Reads a ``with`` mapping field by field, collecting ``(field, problem)`` pairs.

    ``written``: the values are as written in the pipeline, so a reference is accepted
    for what it will resolve to (checked again when the step runs), except where the
    value must be written out."""

    def __init__(self, value: Mapping[str, Any], written: bool) -> None:
        self.value = value
        self.written = written
        self.problems: list[tuple[str, str]] = []

    def problem(self, field: str, message: str) -> None:
        self.problems.append((field, message))

    def pending(self, field: str) -> bool:
        """The field is a reference not resolved yet (only when checking the written
        pipeline)."""
        return self.written and _is_reference(self.value.get(field))

    def literal(self, field: str) -> str | None:
        value = self.value.get(field)
        if value is None:
            self.problem(field, "is required")
            return None
        if _is_reference(value):
            self.problem(field, f"must be written out, not a reference (value={_shown(value)})")
            return None
        if not isinstance(value, str) or not value or len(value) > MAX_NAME:
            limits = f"must be a string of 1 to {MAX_NAME} characters"
            self.problem(field, f"{limits} (value={_shown(value)})")
            return None
        return value


def _read_provider(
    reader: _Reader, providers: Mapping[str, ModelProvider], allowed: Collection[str] | None
) -> ModelProvider | None:
    name = reader.literal("provider")
    if name is None:
        return None
    provider = providers.get(name)
    if provider is None:
        known = describe_providers(providers)
        reader.problem("provider", f"unknown provider {name!r}; {known}")
    elif allowed is not None and name not in allowed:
        granted = ", ".join(sorted(allowed)) or "none"
        reader.problem("provider", f"provider {name!r} is not allowed for this tenant ({granted})")
        return None
    return provider


def _read_model(reader: _Reader, provider: ModelProvider | None) -> str | None:
    model = reader.literal("model")
    if model is None or provider is None or not provider.models:
        return model
    if model not in provider.models:
        name = reader.value.get("provider")
        offered = ", ".join(provider.models)
        reader.problem("model", f"{model!r} is not offered by provider {name!r} ({offered})")
    return model


def _read_messages(reader: _Reader) -> tuple[tuple[str, str], ...]:
    has_prompt, has_messages = "prompt" in reader.value, "messages" in reader.value
    if has_prompt == has_messages:
        reader.problem("prompt", "give exactly one of prompt and messages")
        return ()
    if has_prompt:
        prompt = reader.value["prompt"]
        if prompt is None or prompt == "":
            reader.problem("prompt", f"must not be empty (value={_shown(prompt)})")
            return ()
        return (("user", _as_text(prompt)),)
    messages = reader.value["messages"]
    if reader.pending("messages"):
        return ()
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        reader.problem(
            "messages", f"must be a non-empty list of {{role, content}} (value={_shown(messages)})"
        )
        return ()
    out: list[tuple[str, str]] = []
    for n, message in enumerate(messages):
        where = f"messages[{n}]"
        if reader.written and _is_reference(message):
            continue
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            shape = "must be a mapping of role and content"
            reader.problem(where, f"{shape} (value={_shown(message)})")
            continue
        role, content = message["role"], message["content"]
        if not (reader.written and _is_reference(role)) and role not in ROLES:
            roles = ", ".join(ROLES)
            reader.problem(f"{where}.role", f"must be one of {roles} (value={_shown(role)})")
            continue
        if content is None or content == "":
            reader.problem(f"{where}.content", f"must not be empty (value={_shown(content)})")
            continue
        out.append((str(role), _as_text(content)))
    return tuple(out)


def _read_int(reader: _Reader, field: str, low: int, high: int) -> int | None:
    value = reader.value.get(field)
    if value is None or reader.pending(field):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        reader.problem(field, f"must be an integer from {low} to {high} (value={_shown(value)})")
        return None
    return value


def _read_options(
    reader: _Reader, provider: ModelProvider | None
) -> tuple[int | None, float | None, tuple[str, ...], int | None, str]:
    cap = provider.max_output_tokens if provider is not None else 1_000_000
    max_tokens = _read_int(reader, "max_tokens", 1, cap)
    temperature = None if reader.pending("temperature") else reader.value.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 <= temperature <= 2
    ):
        shown = _shown(temperature)
        reader.problem("temperature", f"must be a number from 0 to 2 (value={shown})")
        temperature = None
    stop = reader.value.get("stop")
    stops: tuple[str, ...] = ()
    if stop is not None and not reader.pending("stop"):
        items = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(items, list)
            or not 1 <= len(items) <= MAX_STOP
            or not all(isinstance(s, str) and s for s in items)
        ):
            shape = f"must be 1 to {MAX_STOP} non-empty strings"
            reader.problem("stop", f"{shape} (value={_shown(stop)})")
        else:
            stops = tuple(items)
    seed = _read_int(reader, "seed", 0, 2**63 - 1)
    if "seed" in reader.value and provider is not None and provider.api is not ModelApi.OPENAI:
        name = reader.value.get("provider")
        reader.problem("seed", f"provider {name!r} ({provider.api.value} API) takes no seed")
    output = reader.value.get("output", "text")
    if output not in OUTPUTS:
        reader.problem("output", f"must be text or json (value={_shown(output)})")
        output = "text"
    return max_tokens, temperature, stops, seed, str(output)


def _read_schema(reader: _Reader, output: str) -> Mapping[str, Any] | None:
    if "schema" not in reader.value:
        return None
    schema = reader.value["schema"]
    if output != "json":
        reader.problem("schema", "needs output: json (a schema checks a JSON reply)")
        return None
    problem = schema_problem(schema)
    if problem is not None:
        reader.problem("schema", problem)
        return None
    return dict(schema)


def _read(
    value: object,
    providers: Mapping[str, ModelProvider],
    written: bool,
    allowed: Collection[str] | None = None,
) -> tuple[ModelRequest | None, list[tuple[str, str]]]:
    if not isinstance(value, Mapping):
        return None, [("", f"with must be a mapping (value={_shown(value)})")]
    reader = _Reader(value, written)
    unknown = sorted(str(k) for k in value if k not in FIELDS)
    if unknown:
        reader.problem(
            unknown[0], f"unknown field(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})"
        )
    provider = _read_provider(reader, providers, allowed)
    model = _read_model(reader, provider)
    system = value.get("system")
    if system is not None and system == "":
        reader.problem("system", "must not be empty (leave it out instead)")
    messages = _read_messages(reader)
    max_tokens, temperature, stop, seed, output = _read_options(reader, provider)
    schema = _read_schema(reader, output)
    if reader.problems or provider is None or model is None:
        return None, reader.problems
    return (
        ModelRequest(
            provider_name=str(value["provider"]),
            provider=provider,
            model=model,
            system=None if system is None else _as_text(system),
            messages=messages,
            max_tokens=max_tokens or min(1024, provider.max_output_tokens),
            temperature=None if temperature is None else float(temperature),
            stop=stop,
            seed=seed,
            output=output,
            schema=schema,
        ),
        [],
    )


def call_problems(
    value: object,
    providers: Mapping[str, ModelProvider],
    allowed: Collection[str] | None = None,
) -> list[tuple[str, str]]:
    """What is wrong with a ``model`` step's ``with`` as written in a pipeline, for a
    tenant that may call the providers ``allowed`` (None: all): ``(field, problem)``
    pairs (empty when it may be submitted)."""
    return _read(value, providers, written=True, allowed=allowed)[1]


def parse_request(value: object, providers: Mapping[str, ModelProvider]) -> ModelRequest:
    """The call of a step whose references are resolved; :class:`StepFailed` naming every
    problem otherwise."""
    request, problems = _read(value, providers, written=False)
    if request is None:
        text = "; ".join(f"with.{f}: {m}" if f else m for f, m in problems)
        raise StepFailed(text)
    return request


def _api_key(request: ModelRequest) -> str | None:
    variable = request.provider.api_key_env
    if variable is None:
        return None
    key = os.environ.get(variable, "")
    if not key:
        raise StepFailed(
            f"provider {request.provider_name!r}: its key variable {variable} is not set "
            "on this runtime (the platform's configuration)"
        )
    return key


def _openai(request: ModelRequest, key: str | None) -> tuple[str, dict[str, str], dict[str, Any]]:
    messages = [{"role": "system", "content": request.system}] if request.system else []
    messages += [{"role": role, "content": content} for role, content in request.messages]
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens,
    }
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return f"{request.provider.base_url}/chat/completions", headers, body


def _anthropic(
    request: ModelRequest, key: str | None
) -> tuple[str, dict[str, str], dict[str, Any]]:
    systems = [request.system] if request.system else []
    systems += [content for role, content in request.messages if role == "system"]
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": [
            {"role": role, "content": content}
            for role, content in request.messages
            if role != "system"
        ],
    }
    if systems:
        body["system"] = "\n\n".join(systems)
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if key:
        headers["x-api-key"] = key
    return f"{request.provider.base_url}/v1/messages", headers, body


def _reply_fields(api: ModelApi, body: Any) -> tuple[str, str | None, int | None, int | None, str]:
    """text, finish reason, input and output tokens, model; KeyError/TypeError/IndexError
    on a reply of another shape."""
    if api is ModelApi.OPENAI:
        choice = body["choices"][0]
        text = choice["message"].get("content") or ""
        usage = body.get("usage") or {}
        return (
            str(text),
            choice.get("finish_reason"),
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
            str(body.get("model") or ""),
        )
    blocks = body["content"]
    text = "".join(str(b["text"]) for b in blocks if b.get("type") == "text")
    usage = body.get("usage") or {}
    return (
        text,
        body.get("stop_reason"),
        usage.get("input_tokens"),
        usage.get("output_tokens"),
        str(body.get("model") or ""),
    )


def _provider_message(response: httpx.Response, key: str | None) -> str:
    """The provider's own words about a refused request (``error.message`` of both APIs),
    shortened, with the key scrubbed should a provider echo it."""
    try:
        error = response.json().get("error")
        text = error.get("message") if isinstance(error, Mapping) else error
    except (ValueError, AttributeError):
        text = None
    text = str(text) if text else response.text
    if key:
        text = text.replace(key, "***")
    text = " ".join(text.split())
    return text[:_QUOTED] + ("..." if len(text) > _QUOTED else "")


def _answer(request: ModelRequest, response: httpx.Response, key: str | None) -> dict[str, Any]:
    where = f"provider {request.provider_name!r} model {request.model!r}"
    status = response.status_code
    if status in (401, 403):
        raise StepFailed(f"{where}: HTTP {status}: the provider refused the platform's credentials")
    if status >= 500 or status in _RETRYABLE:
        raise TransientError(
            f"{where}: HTTP {status}: {_provider_message(response, key)}",
            retry_after_s=retry_after_s(response.headers),
        )
    if status >= 400:
        raise StepFailed(f"{where}: HTTP {status}: {_provider_message(response, key)}")
    try:
        text, finish, tokens_in, tokens_out, model = _reply_fields(
            request.provider.api, response.json()
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise TransientError(
            f"{where}: HTTP {status} with a reply that is not a {request.provider.api.value} "
            f"answer: {_provider_message(response, key)}"
        ) from None
    out: dict[str, Any] = {
        "text": text,
        "provider": request.provider_name,
        "model": model or request.model,
        "finish_reason": finish,
        "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
    }
    return out


def _parsed(request: ModelRequest, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with its text parsed as ``json`` when the step asked for it."""
    if request.output != "json":
        return out
    text = out["text"]
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as exc:
        excerpt = text[:_QUOTED] + ("..." if len(text) > _QUOTED else "")
        raise TransientError(
            f"provider {request.provider_name!r} model {request.model!r}: output json "
            f"asked, and the reply is not JSON ({exc}): {excerpt!r}"
        ) from None
    if request.schema is not None:
        try:
            problem = reply_problem(request.schema, parsed)
        except UnusableSchema as exc:
            raise StepFailed(f"provider {request.provider_name!r}: {exc}") from None
        if problem is not None:
            raise TransientError(
                f"provider {request.provider_name!r} model {request.model!r}: the reply does "
                f"not match the step's schema: {problem}"
            )
    return {**out, "json": parsed}


async def model_call(ctx: StepContext) -> dict[str, Any]:
    """The ``model`` handler (see the module doc)."""
    request = parse_request(ctx.inputs, handler_settings().model_providers)
    budgets, tenant = ctx.model_budgets, ctx.tenant_id
    reservation = None  # None: no budget (outside a pool, or the tenant has none)
    if budgets is not None and tenant:
        try:
            reservation = await budgets.reserve(tenant, request.max_tokens)
        except BudgetSpent:
            record_call(tenant, request.provider_name, None, CallOutcome.REFUSED)
            raise
    used = 0
    try:
        out = await _call(request, tenant)
        usage = out["usage"]
        used = token_count(usage["input_tokens"]) + token_count(usage["output_tokens"])
        if usage["input_tokens"] is None and usage["output_tokens"] is None:
            used = request.max_tokens  # no usage reported: the most the reply could be
    finally:  # a failed (or cancelled) call used nothing: what it held is freed
        if budgets is not None and reservation is not None:
            await asyncio.shield(budgets.settle(reservation, used))
    return _parsed(request, out)


async def _call(request: ModelRequest, tenant: str | None) -> dict[str, Any]:
    """One request to the provider, answered in the handler's shape (unparsed)."""
    import httpx

    key = _api_key(request)
    build = _openai if request.provider.api is ModelApi.OPENAI else _anthropic
    url, headers, body = build(request, key)
    headers = {**request.provider.headers, **headers}
    name = request.provider_name
    try:
        async with httpx.AsyncClient(timeout=request.provider.timeout_s) as client:
            response = await client.post(url, json=body, headers=headers)
        out = _answer(request, response, key)
    except (httpx.TransportError, httpx.TimeoutException) as exc:
        record_call(tenant, name, None, CallOutcome.RETRIED)
        raise TransientError(f"provider {name!r}: POST {url}: {type(exc).__name__}: {exc}") from exc
    except TransientError:
        record_call(tenant, name, None, CallOutcome.RETRIED)
        raise
    except StepFailed:
        record_call(tenant, name, None, CallOutcome.FAILED)
        raise
    usage = out["usage"]
    tokens = token_count(usage["input_tokens"]), token_count(usage["output_tokens"])
    record_call(tenant, name, out["model"], CallOutcome.OK, *tokens)
    return out
