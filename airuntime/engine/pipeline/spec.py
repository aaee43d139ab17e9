"""The pipeline format as users write it: pydantic models that reject unknown fields,
and the size limits a pipeline is held to.

These models are the boundary: whatever arrives (YAML, JSON, Python objects) is
validated into them before anything else looks at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$"
INPUT_HANDLER = "input"
#: Deepest nesting accepted inside ``with``/``inputs`` (keeps every encoder and walker far
#: from the interpreter's recursion limit).
MAX_VALUE_DEPTH = 128


class StrictModel(BaseModel):
    """Unknown fields, type coercion and non-finite numbers are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RetryPolicy(StrictModel):
    """How often a step is attempted and how long to wait between attempts."""

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(default=1, ge=1, le=100)
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_multiplier: float = Field(default=2.0, ge=1)
    backoff_max_s: float = Field(default=60.0, ge=0, validate_default=True)
    jitter: float = Field(default=0.0, ge=0, le=1)

    @field_validator("backoff_max_s")
    @classmethod
    def _max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("backoff_initial_s")
        if initial is not None and value < initial:
            raise ValueError(f"must be >= backoff_initial_s ({initial})")
        return value


class ConcurrencySpec(StrictModel):
    """What a step consumes, for throttling: at least one field must be set."""

    model_config = ConfigDict(frozen=True)

    provider: str | None = Field(default=None, min_length=1, max_length=256)
    model: str | None = Field(default=None, min_length=1, max_length=256)
    operation: str | None = Field(default=None, min_length=1, max_length=256)
    key: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _at_least_one(self) -> ConcurrencySpec:
        if (self.provider, self.model, self.operation, self.key) == (None, None, None, None):
            raise ValueError("at least one of provider, model, operation, key must be set")
        return self

    @property
    def scope(self) -> str:
        """``provider/model/operation[/key]`` with ``*`` for unset parts."""
        parts = [_scope_part(p) for p in (self.provider, self.model, self.operation)]
        if self.key is not None:
            parts.append(_scope_part(self.key))
        return "/".join(parts)


def _scope_part(value: str | None) -> str:
    if value is None:
        return "*"
    # keep the scope unambiguous: '/' separates parts and '*' means "unset"
    return value.replace("%", "%25").replace("/", "%2F").replace("*", "%2A")


class ThrottleMatch(StrictModel):
    """Which steps a throttle rule applies to; ``None`` matches anything."""

    model_config = ConfigDict(frozen=True)

    provider: str | None = Field(default=None, min_length=1, max_length=256)
    model: str | None = Field(default=None, min_length=1, max_length=256)
    operation: str | None = Field(default=None, min_length=1, max_length=256)

    def matches(self, spec: ConcurrencySpec) -> bool:
        return all(
            want is None or want == have
            for want, have in (
                (self.provider, spec.provider),
                (self.model, spec.model),
                (self.operation, spec.operation),
            )
        )


class ThrottleRule(StrictModel):
    """At most ``limit`` concurrent attempts per scope (0: the policy denies the steps)."""

    model_config = ConfigDict(frozen=True)

    match: ThrottleMatch
    limit: int = Field(ge=0)
    lease_ttl_s: float = Field(default=30.0, gt=0)


class StepSpec(StrictModel):
    """One step as written by the user."""

    model_config = ConfigDict(populate_by_name=True)

    id: str = Field(pattern=ID_PATTERN)
    uses: str = Field(min_length=1)
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    depends_on: list[str] = Field(default_factory=list)
    retry: RetryPolicy | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    concurrency: ConcurrencySpec | None = None


class StepDefaults(StrictModel):
    """Applied to steps that do not set their own ``retry``/``timeout_s``."""

    retry: RetryPolicy | None = None
    timeout_s: float | None = Field(default=None, gt=0)


class PipelineSpec(StrictModel):
    """A whole pipeline as written by the user."""

    id: str = Field(pattern=ID_PATTERN)
    description: str = ""
    failure_policy: Literal["fail_fast", "continue"] = "fail_fast"
    inputs: dict[str, Any] = Field(default_factory=dict)
    defaults: StepDefaults = Field(default_factory=StepDefaults)
    throttle: list[ThrottleRule] = Field(default_factory=list)
    steps: list[StepSpec] = Field(min_length=1)


@dataclass(frozen=True)
class PipelineLimits:
    """Size limits, checked at compile time (``max_output_bytes`` is enforced by the engine)."""

    max_steps: int = 50_000
    max_edges: int = 1_000_000
    max_pipeline_bytes: int = 8 * 1024 * 1024
    max_input_bytes: int = 1024 * 1024
    max_output_bytes: int = 1024 * 1024


DEFAULT_LIMITS = PipelineLimits()
