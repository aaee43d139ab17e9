"""The compiled plan: what workers run, and its canonical JSON form.

A :class:`Plan` is plain frozen data in a deterministic topological order. It is
stored with the execution as canonical JSON, so a worker in another process rebuilds
exactly the same plan (:meth:`Plan.from_json`) and can compare digests.

A large plan is stored compressed (:meth:`Plan.stored`): above
:data:`COMPRESS_ABOVE_BYTES` of JSON the execution's ``plan`` key holds zlib (level 1)
behind :data:`COMPRESSED_PREFIX`, which no JSON text starts with. A 100,000-step
fan-out's plan is 24 MB of JSON, most of it the same defaults step after step: it was
61 % of the execution's memory at creation and stayed for the whole retention window
(a finished execution keeps its plan); compressed it is 0.56 MB, made in ~50 ms and
read back in ~30. The digest stays that of the canonical JSON, so creating the same
execution again is recognised whichever form was stored. Readers go through
:func:`plan_json_of` (or :meth:`Plan.from_json`, which takes either form).
"""

from __future__ import annotations

import functools
import hashlib
import json
import typing
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError

from airuntime.core.gc_tuning import collector_paused
from airuntime.engine.pipeline.loading import convert_validation_error
from airuntime.engine.pipeline.spec import (
    DEFAULT_LIMITS,
    ID_PATTERN,
    INPUT_HANDLER,
    ConcurrencySpec,
    PipelineLimits,
    RetryPolicy,
    StrictModel,
)

PLAN_FORMAT = 1

COMPRESSED_PREFIX: typing.Final = b"\x00zlib\x00"
"""Starts a stored plan that is zlib-compressed canonical JSON (JSON never starts so)."""
COMPRESS_ABOVE_BYTES: typing.Final = 64 * 1024
"""Plans with more canonical JSON than this are stored compressed; smaller ones as text
(readable with ``redis-cli GET``; compressing them would save little)."""
MAX_PLAN_JSON_BYTES: typing.Final = 512 * 1024 * 1024
"""The most JSON a stored compressed plan may expand to (a damaged or foreign value
is refused rather than inflated without bound)."""


@dataclass(frozen=True)
class ResolvedThrottle:
    """The throttle that applies to one step: ``scope`` names the shared semaphore."""

    scope: str
    limit: int
    lease_ttl_s: float


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One step of a compiled plan.  ``deps`` = explicit ``depends_on`` plus the steps whose
    outputs ``inputs`` reference (``refs``); all step tuples are in plan order."""

    id: str
    order: int
    handler: str
    inputs: Any
    deps: tuple[str, ...]
    refs: tuple[str, ...]
    children: tuple[str, ...]
    retry: RetryPolicy
    timeout_s: float | None
    concurrency: ConcurrencySpec | None
    throttle: ResolvedThrottle | None
    is_input: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "handler": self.handler,
            "inputs": self.inputs,
            "deps": list(self.deps),
            "refs": list(self.refs),
            "retry": _dump(self.retry),
            "timeout_s": self.timeout_s,
            "concurrency": None if self.concurrency is None else _dump(self.concurrency),
            "throttle": (
                None
                if self.throttle is None
                else {
                    "scope": self.throttle.scope,
                    "limit": self.throttle.limit,
                    "lease_ttl_s": self.throttle.lease_ttl_s,
                }
            ),
        }


@functools.lru_cache(maxsize=1024)
def _dump_cached(model: RetryPolicy | ConcurrencySpec) -> dict[str, Any]:
    return model.model_dump(mode="json")


def _dump(model: RetryPolicy | ConcurrencySpec) -> dict[str, Any]:
    """``model_dump`` of the (frozen, hashable, mostly shared) per-step models, memoized."""
    return dict(_dump_cached(model))


_M = typing.TypeVar("_M", RetryPolicy, ConcurrencySpec)


def _load_model(cls: type[_M], data: dict[str, Any], cache: dict[Any, Any]) -> _M:
    """Validate one per-step model, sharing instances between identical inputs."""
    try:
        key = (cls, tuple(sorted(data.items())))
        hash(key)
    except TypeError:
        return cls.model_validate(data)
    found = cache.get(key)
    if found is None:
        found = cache[key] = cls.model_validate(data)
    return typing.cast(_M, found)


@dataclass(frozen=True, repr=False)
class Plan:
    """A validated pipeline: steps in deterministic topological order (Kahn's algorithm,
    ties broken by declaration order), ``index`` maps step id -> position in ``steps``."""

    pipeline_id: str
    failure_policy: Literal["fail_fast", "continue"]
    inputs: dict[str, Any]
    steps: tuple[PlanStep, ...]
    index: dict[str, int]
    limits: PipelineLimits = field(default=DEFAULT_LIMITS)

    def __repr__(self) -> str:
        return (
            f"Plan(pipeline_id={self.pipeline_id!r}, steps={len(self.steps)}, "
            f"digest={self.digest[:12]!r})"
        )

    def step(self, step_id: str) -> PlanStep:
        """The step with this id (``KeyError`` if unknown)."""
        return self.steps[self.index[step_id]]

    @property
    def roots(self) -> tuple[PlanStep, ...]:
        """Steps without dependencies (ready as soon as an execution starts)."""
        return tuple(s for s in self.steps if not s.deps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "pipeline_id": self.pipeline_id,
            "failure_policy": self.failure_policy,
            "inputs": self.inputs,
            "limits": asdict(self.limits),
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no whitespace); :meth:`from_json` rebuilds the plan."""
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        # Once per plan: a plan is immutable and one may serve many runs (PlanCache).
        with collector_paused():
            return json.dumps(
                self.to_dict(),
                sort_keys=True,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
            )

    @functools.cached_property
    def digest(self) -> str:
        """sha256 hex digest of :meth:`to_json`."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def stored(self) -> str | bytes:
        """What the execution's ``plan`` key holds: :meth:`to_json`, or for a plan of
        more than :data:`COMPRESS_ABOVE_BYTES` its zlib behind :data:`COMPRESSED_PREFIX`
        (see the module doc)."""
        return self._stored

    @functools.cached_property
    def _stored(self) -> str | bytes:
        text = self.to_json()
        data = text.encode("utf-8")
        if len(data) <= COMPRESS_ABOVE_BYTES:
            return text
        return COMPRESSED_PREFIX + zlib.compress(data, 1)

    @classmethod
    def from_json(cls, data: str | bytes) -> Plan:
        """Rebuild a plan stored with :meth:`to_json` or :meth:`stored`; raises
        ``ValueError`` if malformed."""
        data = plan_json_of(data)
        with collector_paused():  # a large plan is many objects, none of them garbage
            doc = _parse_doc(data)
            index = _index_steps(doc.steps)
            return cls(
                pipeline_id=doc.pipeline_id,
                failure_policy=doc.failure_policy,
                inputs=doc.inputs,
                steps=_plan_steps(doc.steps),
                index=index,
                limits=PipelineLimits(**doc.limits.model_dump()),
            )


def plan_json_of(stored: str | bytes) -> str:
    """The canonical JSON of a stored plan (:meth:`Plan.stored`: text, or compressed);
    ``ValueError`` when a compressed one is damaged or expands beyond
    :data:`MAX_PLAN_JSON_BYTES`."""
    if isinstance(stored, str):
        return stored
    if not stored.startswith(COMPRESSED_PREFIX):
        return stored.decode("utf-8")
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(stored[len(COMPRESSED_PREFIX) :], MAX_PLAN_JSON_BYTES)
    except zlib.error as exc:
        raise ValueError(f"stored plan: damaged compressed data ({exc})") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise ValueError(
            "stored plan: compressed data is truncated or expands beyond "
            f"{MAX_PLAN_JSON_BYTES} bytes"
        )
    return data.decode("utf-8")


class _ThrottleDoc(StrictModel):
    scope: str
    limit: int = Field(ge=0)
    lease_ttl_s: float = Field(gt=0)


class _StepDoc(StrictModel):
    id: str = Field(pattern=ID_PATTERN)
    handler: str
    inputs: Any
    deps: list[str]
    refs: list[str]
    retry: dict[str, Any]
    timeout_s: float | None
    concurrency: dict[str, Any] | None
    throttle: _ThrottleDoc | None


class _LimitsDoc(StrictModel):
    max_steps: int
    max_edges: int
    max_pipeline_bytes: int
    max_input_bytes: int
    max_output_bytes: int


class _PlanDoc(StrictModel):
    format: int
    pipeline_id: str
    failure_policy: Literal["fail_fast", "continue"]
    inputs: dict[str, Any]
    limits: _LimitsDoc
    steps: list[_StepDoc]


# -- reading the JSON back -------------------------------------------------------------


def _parse_doc(data: str | bytes) -> _PlanDoc:
    try:
        doc = _PlanDoc.model_validate_json(data)
    except ValidationError as exc:
        problems = convert_validation_error(exc, _PlanDoc)
        lines = [f"invalid plan JSON: {p}" for p in problems]
        raise ValueError("\n".join(lines)) from None
    if doc.format != PLAN_FORMAT:
        raise ValueError(f"plan format {doc.format} is not supported (expected {PLAN_FORMAT})")
    return doc


def _index_steps(steps: typing.Sequence[_StepDoc]) -> dict[str, int]:
    """Step id -> position; every dependency must be an earlier step (plan order)."""
    index: dict[str, int] = {}
    for pos, s in enumerate(steps):
        if s.id in index:
            raise ValueError(f"invalid plan JSON: duplicate step id {s.id!r}")
        for dep in s.deps:
            if dep not in index:
                raise ValueError(
                    f"invalid plan JSON: step {s.id!r} depends on {dep!r}, "
                    "which is not an earlier step"
                )
        index[s.id] = pos
    return index


def _step_models(
    steps: typing.Sequence[_StepDoc],
) -> tuple[list[RetryPolicy], list[ConcurrencySpec | None]]:
    """The per-step models, identical ones shared (a plan of 20,000 steps has few)."""
    cache: dict[Any, Any] = {}
    try:
        retries = [_load_model(RetryPolicy, s.retry, cache) for s in steps]
        concurrency = [
            None if s.concurrency is None else _load_model(ConcurrencySpec, s.concurrency, cache)
            for s in steps
        ]
    except ValidationError as exc:
        raise ValueError(f"invalid plan JSON: {exc}") from None
    return retries, concurrency


def _plan_steps(steps: typing.Sequence[_StepDoc]) -> tuple[PlanStep, ...]:
    children: dict[str, list[str]] = {s.id: [] for s in steps}
    for s in steps:
        for dep in s.deps:
            children[dep].append(s.id)
    retries, concurrency = _step_models(steps)
    return tuple(
        PlanStep(
            id=s.id,
            order=pos,
            handler=s.handler,
            inputs=s.inputs,
            deps=tuple(s.deps),
            refs=tuple(s.refs),
            children=tuple(children[s.id]),
            retry=retries[pos],
            timeout_s=s.timeout_s,
            concurrency=concurrency[pos],
            throttle=(
                None
                if s.throttle is None
                else ResolvedThrottle(s.throttle.scope, s.throttle.limit, s.throttle.lease_ttl_s)
            ),
            is_input=s.handler == INPUT_HANDLER,
        )
        for pos, s in enumerate(steps)
    )
