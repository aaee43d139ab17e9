"""The model providers the platform offers to ``model`` steps.

Why this module exists: a ``model`` step calls a language model, and which endpoints a
tenant's pipeline may call, with whose credentials, is the platform operator's decision.
So the providers are a process setting, ``AIRUNTIME_MODEL_PROVIDERS`` (a JSON object, read
with the handler policy of :mod:`~airuntime.engine.handlers.settings`): each named
provider says which API it speaks, where it is, the *name* of the environment variable
holding its key (never the key), which models steps may ask for and how many output
tokens at most. A pipeline names a provider and a model; it never names a URL or a key,
so it cannot send the platform's credentials anywhere else, and the key never enters a
run's record, ledger or history.

Example (the value of ``AIRUNTIME_MODEL_PROVIDERS``)::

    {"openai": {"api": "openai", "base_url": "https://api.openai.com/v1",
                "api_key_env": "OPENAI_API_KEY", "models": ["gpt-4o-mini"]},
     "claude": {"api": "anthropic", "base_url": "https://api.anthropic.com",
                "api_key_env": "ANTHROPIC_API_KEY", "max_output_tokens": 2048},
     "local":  {"base_url": "http://127.0.0.1:11434/v1"}}

``base_url`` is what each vendor's SDK calls it: OpenAI's includes ``/v1`` (requests go
to ``<base_url>/chat/completions``, as for vLLM, Ollama, llama.cpp's server, LiteLLM);
Anthropic's does not (``<base_url>/v1/messages``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from airuntime.core.validation import format_validation_error

__all__ = [
    "MODEL_PROVIDERS_ENV",
    "ModelApi",
    "ModelProvider",
    "describe_providers",
    "parse_providers",
]

MODEL_PROVIDERS_ENV: Final = "AIRUNTIME_MODEL_PROVIDERS"

PROVIDER_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER_NAME: Final = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
_CREDENTIAL_HEADERS: Final = frozenset({"authorization", "x-api-key", "api-key", "cookie"})


class ModelApi(StrEnum):
    """The wire protocol a provider speaks."""

    OPENAI = "openai"
    """OpenAI's Chat Completions (``POST <base_url>/chat/completions``) and the many
    servers compatible with it."""
    ANTHROPIC = "anthropic"
    """Anthropic's Messages API (``POST <base_url>/v1/messages``)."""


class ModelProvider(BaseModel):
    """One provider of ``AIRUNTIME_MODEL_PROVIDERS`` (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api: ModelApi = ModelApi.OPENAI
    """The protocol: ``openai`` (default) or ``anthropic``."""
    base_url: str
    """``http(s)://host[:port][/path]``, without credentials, query or fragment."""
    api_key_env: str | None = None
    """The environment variable of the runtimes that holds the key (``OPENAI_API_KEY``);
    None: the provider takes no key (a local server)."""
    models: tuple[Annotated[str, Field(min_length=1, max_length=256)], ...] = ()
    """The models steps may ask for; empty: any the provider serves."""
    max_output_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    """The most output tokens a step may ask for (its default when it asks none)."""
    timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """How long one request may take before it counts as failed (and is retried)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra request headers that are not credentials (``OpenAI-Organization``)."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a URL: {exc}") from None
        del port
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} must be an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"{value!r} must not carry credentials (use api_key_env)")
        if parts.query or parts.fragment:
            raise ValueError(f"{value!r} must have no query or fragment")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _key_variable(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        if value.upper().startswith("AIRUNTIME_"):
            # The runtimes' own secrets (the intake token, the history DSN) live there.
            raise ValueError(f"{value!r}: an AIRUNTIME_ variable is never sent to a provider")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a header name")
            if name.lower() in _CREDENTIAL_HEADERS:
                raise ValueError(f"header {name!r} carries credentials: use api_key_env")
            if "\r" in text or "\n" in text:
                raise ValueError(f"header {name!r} has a line break in its value")
        return value


def parse_providers(value: object) -> dict[str, ModelProvider]:
    """``AIRUNTIME_MODEL_PROVIDERS`` as read (a JSON text, or the object itself) checked:
    provider names, then each provider (ValueError naming what is wrong)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object of provider name to provider")
    providers: dict[str, ModelProvider] = {}
    for name, spec in value.items():
        if not isinstance(name, str) or not PROVIDER_NAME.match(name):
            raise ValueError(
                f"provider name {name!r}: lower-case letters, digits, '.', '_', '-' "
                "(at most 63, starting with a letter or digit)"
            )
        try:
            providers[name] = ModelProvider.model_validate(spec)
        except ValidationError as exc:
            problem = format_validation_error(exc, with_value=False)
            raise ValueError(f"provider {name!r}: {problem}") from None
    return providers


def describe_providers(providers: Mapping[str, ModelProvider]) -> str:
    """The providers a step may name, for a refusal."""
    if not providers:
        return f"the platform defines none ({MODEL_PROVIDERS_ENV} is unset)"
    return "the platform defines: " + ", ".join(sorted(providers))
