"""The pipeline format and its compiler.

Why this module exists: a pipeline arrives as untrusted YAML, JSON or Python objects, but the
engine and every worker need a graph they can trust blindly.  This module is the single gate
between the two.  It defines the user-facing format (pydantic models, unknown fields
rejected), checks *everything* that can be checked statically -- handler names, ids,
dependencies, references between steps, cycles, sizes -- before anything is written to
Redis, and compiles the result into a :class:`Plan`: plain frozen dataclasses in a
deterministic topological order, serialisable to canonical JSON so that workers in other
processes rebuild exactly the same plan (and can compare digests).

Every problem is reported as a :class:`PipelineError` whose lines read
``<location>: <what is wrong> (value=...)``, all problems at once where practical.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import heapq
import json
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from airuntime.core.errors import AirError
from airuntime.engine.handlers import HandlerRegistry, default_registry
from airuntime.engine.references import (
    ReferenceSyntaxError,
    input_ref,
    iter_strings,
    parse_references,
    step_ref,
)

__all__ = [
    "DEFAULT_LIMITS",
    "INPUT_HANDLER",
    "PLAN_FORMAT",
    "ConcurrencySpec",
    "Pipeline",
    "PipelineError",
    "PipelineLimits",
    "PipelineSpec",
    "Plan",
    "PlanStep",
    "Problem",
    "ResolvedThrottle",
    "RetryPolicy",
    "StepDefaults",
    "StepRef",
    "StepSpec",
    "ThrottleMatch",
    "ThrottleRule",
    "compile_pipeline",
    "load_pipeline",
    "load_plan",
    "parse_pipeline",
]

ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$"
INPUT_HANDLER = "input"
PLAN_FORMAT = 1
#: Deepest nesting accepted inside ``with``/``inputs`` (keeps every encoder and walker far
#: from the interpreter's recursion limit).
MAX_VALUE_DEPTH = 128


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pipeline: ``loc`` like ``steps[3].depends_on``."""

    loc: str
    message: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}" if self.loc else self.message


class PipelineError(AirError, ValueError):
    """The pipeline is invalid; ``problems`` lists every problem found, ``str()`` shows one
    per line (prefixed with ``source``, e.g. the file name, when known)."""

    def __init__(self, problems: Sequence[Problem] | str, *, source: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return "\n".join(f"{prefix}{p}" for p in self.problems)


def _fmt(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _loc(parts: Iterable[str | int]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += "(key)"
        elif _IDENT.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


# ---------------------------------------------------------------------------------------
# The format
# ---------------------------------------------------------------------------------------
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RetryPolicy(_Model):
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


class ConcurrencySpec(_Model):
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


class ThrottleMatch(_Model):
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


class ThrottleRule(_Model):
    """At most ``limit`` concurrent attempts per scope (0: the policy denies the steps)."""

    model_config = ConfigDict(frozen=True)

    match: ThrottleMatch
    limit: int = Field(ge=0)
    lease_ttl_s: float = Field(default=30.0, gt=0)


class StepSpec(_Model):
    """One step as written by the user."""

    model_config = ConfigDict(populate_by_name=True)

    id: str = Field(pattern=ID_PATTERN)
    uses: str = Field(min_length=1)
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    depends_on: list[str] = Field(default_factory=list)
    retry: RetryPolicy | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    concurrency: ConcurrencySpec | None = None


class StepDefaults(_Model):
    """Applied to steps that do not set their own ``retry``/``timeout_s``."""

    retry: RetryPolicy | None = None
    timeout_s: float | None = Field(default=None, gt=0)


class PipelineSpec(_Model):
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


# ---------------------------------------------------------------------------------------
# Parsing and loading
# ---------------------------------------------------------------------------------------
def _unwrap_models(annotation: Any) -> list[type[BaseModel]]:
    """The model classes inside ``X``, ``X | None``, ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list):
        return [m for arg in typing.get_args(annotation) for m in _unwrap_models(arg)]
    return []


def _model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        nxt: type[BaseModel] | None = None
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                found = _unwrap_models(info.annotation)
                nxt = found[0] if found else None
                break
        model = nxt
    return model


def _convert_validation_error(
    exc: ValidationError, root: type[BaseModel] = PipelineSpec
) -> list[Problem]:
    """pydantic errors -> ``loc: message (value=...)`` problems."""
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        where = _loc(loc) or "pipeline"
        kind = err["type"]
        msg = err["msg"].removeprefix("Value error, ")
        msg = re.sub(r" or instance of \w+", "", msg)
        if kind == "missing":
            problems.append(Problem(where, "field required"))
        elif kind == "extra_forbidden" and loc and isinstance(loc[-1], str):
            parent = _model_at(root, loc[:-1])
            allowed = (
                [info.alias or name for name, info in parent.model_fields.items()]
                if parent is not None
                else []
            )
            hint = difflib.get_close_matches(loc[-1], allowed, n=1)
            text = f"unknown field {loc[-1]!r}"
            if hint:
                text += f", did you mean {hint[0]!r}?"
            if allowed:
                text += f" (allowed: {', '.join(allowed)})"
            problems.append(Problem(where, text))
        else:
            problems.append(Problem(where, f"{msg} (value={_fmt(err.get('input'))})"))
    return problems


def parse_pipeline(data: Any, *, source: str | None = None) -> PipelineSpec:
    """Validate already-decoded data (a mapping) into a :class:`PipelineSpec`."""
    if isinstance(data, PipelineSpec):
        return data
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise PipelineError(_convert_validation_error(exc), source=source) from None


class _StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[tuple[str, str], yaml.Node] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        ident = (key_node.tag, key_node.value)
        if ident in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key_node.value!r}",
                key_node.start_mark,
            )
        seen[ident] = key_node
    return loader.construct_mapping(node, deep=True)


_StrictYamlLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _decode(text: str, suffix: str) -> Any:
    """Decode a document; raises :class:`PipelineError` with line/column on syntax errors."""
    if suffix == ".json":
        try:
            return json.loads(text, object_pairs_hook=_json_pairs)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno}, column {exc.colno}"
            raise PipelineError([Problem(where, f"invalid JSON: {exc.msg}")]) from None
        except ValueError as exc:  # from _json_pairs
            raise PipelineError([Problem("", f"invalid JSON: {exc}")]) from None
    try:
        # _StrictYamlLoader is a SafeLoader: no arbitrary Python objects
        return yaml.load(text, Loader=_StrictYamlLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(filter(None, [exc.context, exc.problem])) or str(exc)
        raise PipelineError([Problem(where, f"invalid YAML: {what}")]) from None
    except yaml.YAMLError as exc:
        raise PipelineError([Problem("", f"invalid YAML: {exc}")]) from None


_SUFFIXES = (".yaml", ".yml", ".json")


def load_pipeline(path: str | Path, *, limits: PipelineLimits = DEFAULT_LIMITS) -> PipelineSpec:
    """Read a ``.yaml``/``.yml``/``.json`` pipeline file into a validated spec.

    Every failure (unreadable file, unknown suffix, too large, syntax error, invalid
    content) is a :class:`PipelineError` whose lines start with the path.
    """
    path = Path(path)
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise PipelineError(
            f"unsupported file type {path.suffix or '(none)'!r} (expected one of: "
            f"{', '.join(_SUFFIXES)})",
            source=source,
        )
    try:
        with path.open("rb") as fh:  # never read more than the limit allows
            raw = fh.read(limits.max_pipeline_bytes + 1)
    except OSError as exc:
        raise PipelineError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if len(raw) > limits.max_pipeline_bytes:
        raise PipelineError(
            f"the file is over the limit of {limits.max_pipeline_bytes} bytes", source=source
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PipelineError(f"not UTF-8: {exc}", source=source) from None
    try:
        data = _decode(text, suffix)
    except PipelineError as exc:
        raise PipelineError(exc.problems, source=source) from None
    except RecursionError:
        raise PipelineError("nested too deeply", source=source) from None
    if data is None:
        raise PipelineError("pipeline: the document is empty", source=source)
    return parse_pipeline(data, source=source)


# ---------------------------------------------------------------------------------------
# The compiled plan
# ---------------------------------------------------------------------------------------
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

    @classmethod
    def from_json(cls, data: str | bytes) -> Plan:
        """Rebuild a plan stored with :meth:`to_json`; raises ``ValueError`` if malformed."""
        try:
            doc = _PlanDoc.model_validate_json(data)
        except ValidationError as exc:
            problems = _convert_validation_error(exc, _PlanDoc)
            lines = [f"invalid plan JSON: {p}" for p in problems]
            raise ValueError("\n".join(lines)) from None
        if doc.format != PLAN_FORMAT:
            raise ValueError(f"plan format {doc.format} is not supported (expected {PLAN_FORMAT})")
        index: dict[str, int] = {}
        for pos, s in enumerate(doc.steps):
            if s.id in index:
                raise ValueError(f"invalid plan JSON: duplicate step id {s.id!r}")
            for dep in s.deps:
                if dep not in index:
                    raise ValueError(
                        f"invalid plan JSON: step {s.id!r} depends on {dep!r}, "
                        "which is not an earlier step"
                    )
            index[s.id] = pos
        children: dict[str, list[str]] = {s.id: [] for s in doc.steps}
        for s in doc.steps:
            for dep in s.deps:
                children[dep].append(s.id)
        cache: dict[Any, Any] = {}
        try:
            retries = [_load_model(RetryPolicy, s.retry, cache) for s in doc.steps]
            concurrency = [
                None
                if s.concurrency is None
                else _load_model(ConcurrencySpec, s.concurrency, cache)
                for s in doc.steps
            ]
        except ValidationError as exc:
            raise ValueError(f"invalid plan JSON: {exc}") from None
        steps = tuple(
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
                    else ResolvedThrottle(
                        s.throttle.scope, s.throttle.limit, s.throttle.lease_ttl_s
                    )
                ),
                is_input=s.handler == INPUT_HANDLER,
            )
            for pos, s in enumerate(doc.steps)
        )
        return cls(
            pipeline_id=doc.pipeline_id,
            failure_policy=doc.failure_policy,
            inputs=doc.inputs,
            steps=steps,
            index=index,
            limits=PipelineLimits(**doc.limits.model_dump()),
        )


class _ThrottleDoc(_Model):
    scope: str
    limit: int = Field(ge=0)
    lease_ttl_s: float = Field(gt=0)


class _StepDoc(_Model):
    id: str = Field(pattern=ID_PATTERN)
    handler: str
    inputs: Any
    deps: list[str]
    refs: list[str]
    retry: dict[str, Any]
    timeout_s: float | None
    concurrency: dict[str, Any] | None
    throttle: _ThrottleDoc | None


class _LimitsDoc(_Model):
    max_steps: int
    max_edges: int
    max_pipeline_bytes: int
    max_input_bytes: int
    max_output_bytes: int


class _PlanDoc(_Model):
    format: int
    pipeline_id: str
    failure_policy: Literal["fail_fast", "continue"]
    inputs: dict[str, Any]
    limits: _LimitsDoc
    steps: list[_StepDoc]


# ---------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------
class _BadValue(Exception):
    def __init__(self, loc: tuple[str | int, ...], message: str, *, too_big: bool = False) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.too_big = too_big


def _check_json_value(value: Any, cap: int) -> None:
    """Check that ``value`` is plain JSON data no deeper than MAX_VALUE_DEPTH, and stop as
    soon as a lower bound of its encoded size exceeds ``cap`` bytes, so the work is bounded
    even for YAML alias bombs.  Raises :class:`_BadValue`."""
    size = 0
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        if len(loc) > MAX_VALUE_DEPTH:
            raise _BadValue(loc, f"nested deeper than {MAX_VALUE_DEPTH} levels")
        if isinstance(item, str):
            size += len(item) + 2
        elif item is None or isinstance(item, bool | int):
            size += 1
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _BadValue(loc, f"not JSON-serialisable: {item!r} is not a finite number")
            size += 1
        elif isinstance(item, Mapping):
            size += 2
            for key, child in item.items():
                if not isinstance(key, str):
                    raise _BadValue(loc, f"keys must be strings (key={_fmt(key)})")
                size += len(key) + 4
                stack.append(((*loc, key), child))
        elif isinstance(item, list | tuple):
            size += 2 + len(item)
            stack.extend(((*loc, i), child) for i, child in enumerate(item))
        else:
            raise _BadValue(
                loc, f"not JSON-serialisable: {type(item).__name__} (value={_fmt(item)})"
            )
        if size > cap:
            raise _BadValue((), f"at least {size} bytes", too_big=True)


def _normalize(value: Any, cap: int) -> tuple[Any, int]:
    """A JSON round trip of ``value`` (deep copy; lists instead of tuples) and its encoded
    size in bytes.  Raises :class:`_BadValue`."""
    _check_json_value(value, cap)
    try:
        encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise _BadValue((), f"not JSON-serialisable: {exc}") from None
    size = len(encoded.encode("utf-8"))
    if size > cap:
        raise _BadValue((), f"{size} bytes", too_big=True)
    return json.loads(encoded), size


def _find_cycle(
    candidates: Sequence[int], deps: Sequence[Sequence[int]], done: Sequence[bool]
) -> list[int]:
    """A cycle among the nodes Kahn's algorithm could not order.  Each such node has a dep
    that is not done either, so walking those deps must revisit a node: O(V + E)."""
    start = min(i for i in candidates if not done[i])
    position: dict[int, int] = {}
    path: list[int] = []
    node = start
    while node not in position:
        position[node] = len(path)
        path.append(node)
        node = next(d for d in deps[node] if not done[d])
    cycle = path[position[node] :]
    first = cycle.index(min(cycle))
    return cycle[first:] + cycle[:first]


def _topological_order(nodes: Sequence[int], deps: Sequence[Sequence[int]]) -> list[int]:
    """Kahn's algorithm; among ready steps the earliest declared goes first."""
    indegree = {i: len(deps[i]) for i in nodes}
    children: dict[int, list[int]] = {i: [] for i in nodes}
    for i in nodes:
        for d in deps[i]:
            children[d].append(i)
    ready = [i for i in nodes if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for c in children[i]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready, c)
    return order


def compile_pipeline(
    spec: PipelineSpec,
    registry: HandlerRegistry | None = None,
    limits: PipelineLimits = DEFAULT_LIMITS,
) -> Plan:
    """Check a spec completely and compile it into a :class:`Plan`.

    ``registry`` (default: :func:`~airuntime.engine.handlers.default_registry`) decides which
    ``uses`` names exist.  Raises :class:`PipelineError` listing every problem found.
    """
    registry = default_registry() if registry is None else registry
    steps = spec.steps
    if len(steps) > limits.max_steps:
        raise PipelineError(
            [Problem("steps", f"{len(steps)} steps is over the limit of {limits.max_steps}")]
        )
    problems: list[Problem] = []

    first: dict[str, int] = {}
    for i, s in enumerate(steps):
        if s.id in first:
            where = f"steps[{first[s.id]}] and steps[{i}]"
            problems.append(Problem("steps", f"duplicate step id {s.id!r} ({where})"))
        else:
            first[s.id] = i

    # every encoded `with` (and the run inputs) counts against max_pipeline_bytes
    budget = limits.max_pipeline_bytes
    run_inputs: dict[str, Any] = {}
    try:
        run_inputs, used = _normalize(spec.inputs, budget)
        budget -= used
    except _BadValue as bad:
        message = bad.message
        if bad.too_big:
            message = f"{bad.message} JSON-encoded is over the limit of {budget} bytes"
        problems.append(Problem(_loc(("inputs", *bad.loc)), message))
        budget = -1

    handler_names = registry.names()
    known_handlers = set(handler_names)
    deps: list[list[int]] = [[] for _ in steps]
    refs: list[list[int]] = [[] for _ in steps]
    inputs: list[Any] = [None] * len(steps)
    edges = 0
    for i, s in enumerate(steps):
        where = f"steps[{i}]"
        if s.uses not in known_handlers:
            hint = difflib.get_close_matches(s.uses, handler_names, n=1)
            problems.append(
                Problem(
                    f"{where}.uses",
                    f"unknown handler {s.uses!r} (known: {', '.join(handler_names) or 'none'})"
                    + (f"; did you mean {hint[0]!r}?" if hint else ""),
                )
            )
        explicit: set[int] = set()
        for dep in s.depends_on:
            if dep == s.id:
                problems.append(Problem(f"{where}.depends_on", f"step {s.id!r} depends on itself"))
            elif dep not in first:
                problems.append(Problem(f"{where}.depends_on", f"unknown step {dep!r}"))
            else:
                explicit.add(first[dep])

        referenced: set[int] = set()
        checked = False
        if budget >= 0:
            cap = min(limits.max_input_bytes, budget)
            try:
                inputs[i], used = _normalize(s.with_, cap)
                budget -= used
                checked = True
            except _BadValue as bad:
                if not bad.too_big:
                    problems.append(Problem(_loc(("steps", i, "with", *bad.loc)), bad.message))
                elif cap == limits.max_input_bytes:
                    problems.append(
                        Problem(
                            f"{where}.with",
                            f"{bad.message} JSON-encoded is over the limit of "
                            f"{limits.max_input_bytes} bytes",
                        )
                    )
                else:  # the pipeline as a whole is too big: stop measuring
                    problems.append(
                        Problem(
                            "steps",
                            f"JSON-encoded step inputs are over the pipeline limit of "
                            f"{limits.max_pipeline_bytes} bytes (reached at {where}.with)",
                        )
                    )
                    budget = -1
        if checked:
            for sub, text in iter_strings(inputs[i]):
                if "${" not in text:
                    continue
                at = _loc(("steps", i, "with", *sub))
                try:
                    found = parse_references(text)
                except ReferenceSyntaxError as exc:
                    problems.append(Problem(at, f"{exc.detail} in {exc.reference!r}"))
                    continue
                for ref in found:
                    if ref.source != "steps":
                        continue
                    if ref.name == s.id:
                        problems.append(
                            Problem(at, f"step {s.id!r} references its own output in {ref.text!r}")
                        )
                    elif ref.name not in first:
                        problems.append(
                            Problem(at, f"reference to unknown step {ref.name!r} in {ref.text!r}")
                        )
                    else:
                        referenced.add(first[ref.name])

        if s.uses == INPUT_HANDLER:
            if s.retry is not None and s.retry.max_attempts > 1:
                problems.append(
                    Problem(
                        f"{where}.retry.max_attempts",
                        f"'input' steps cannot be retried (value={s.retry.max_attempts})",
                    )
                )
            if s.concurrency is not None:
                problems.append(
                    Problem(
                        f"{where}.concurrency",
                        "not allowed on 'input' steps, they never run on a worker "
                        f"(value={_fmt(s.concurrency.model_dump(exclude_none=True))})",
                    )
                )
        refs[i] = sorted(referenced)
        deps[i] = sorted(explicit | referenced)
        edges += len(deps[i])

    if edges > limits.max_edges:
        problems.append(
            Problem("steps", f"{edges} dependencies is over the limit of {limits.max_edges}")
        )
        raise PipelineError(problems)

    nodes = sorted(first.values())
    topo = _topological_order(nodes, deps)
    if len(topo) < len(nodes):
        done = [False] * len(steps)
        for i in topo:
            done[i] = True
        cycle = [steps[i].id for i in _find_cycle(nodes, deps, done)]
        if len(cycle) > 20:
            cycle = [*cycle[:10], f"... {len(cycle) - 20} more ...", *cycle[-10:]]
        path = " -> ".join([*cycle, cycle[0]])
        problems.append(Problem("steps", f"dependency cycle {path} (x -> y: x depends on y)"))
    if problems:
        raise PipelineError(problems)

    return _build_plan(spec, run_inputs, inputs, topo, deps, refs, limits)


def _build_plan(
    spec: PipelineSpec,
    run_inputs: dict[str, Any],
    inputs: Sequence[Any],
    topo: Sequence[int],
    deps: Sequence[Sequence[int]],
    refs: Sequence[Sequence[int]],
    limits: PipelineLimits,
) -> Plan:
    steps = spec.steps
    position = {decl: pos for pos, decl in enumerate(topo)}
    children: list[list[int]] = [[] for _ in steps]
    for decl in topo:  # visiting in plan order keeps every children list sorted
        for d in deps[decl]:
            children[d].append(decl)
    default_retry = spec.defaults.retry or RetryPolicy()
    single_attempt = RetryPolicy()

    def ids(decls: Iterable[int]) -> tuple[str, ...]:
        return tuple(steps[d].id for d in sorted(decls, key=position.__getitem__))

    plan_steps: list[PlanStep] = []
    for pos, decl in enumerate(topo):
        s = steps[decl]
        is_input = s.uses == INPUT_HANDLER
        if is_input:
            retry = s.retry or single_attempt
            timeout_s = s.timeout_s
        else:
            retry = s.retry or default_retry
            timeout_s = s.timeout_s if s.timeout_s is not None else spec.defaults.timeout_s
        plan_steps.append(
            PlanStep(
                id=s.id,
                order=pos,
                handler=s.uses,
                inputs=inputs[decl],
                deps=ids(deps[decl]),
                refs=ids(refs[decl]),
                children=tuple(steps[c].id for c in children[decl]),
                retry=retry,
                timeout_s=timeout_s,
                concurrency=s.concurrency,
                throttle=_resolve_throttle(s.concurrency, spec.throttle),
                is_input=is_input,
            )
        )
    return Plan(
        pipeline_id=spec.id,
        failure_policy=spec.failure_policy,
        inputs=run_inputs,
        steps=tuple(plan_steps),
        index={s.id: s.order for s in plan_steps},
        limits=limits,
    )


def _resolve_throttle(
    concurrency: ConcurrencySpec | None, rules: Sequence[ThrottleRule]
) -> ResolvedThrottle | None:
    """The first rule matching the step's provider/model/operation, scoped by its spec."""
    if concurrency is None:
        return None
    for rule in rules:
        if rule.match.matches(concurrency):
            return ResolvedThrottle(concurrency.scope, rule.limit, rule.lease_ttl_s)
    return None


def load_plan(
    path: str | Path,
    registry: HandlerRegistry | None = None,
    limits: PipelineLimits = DEFAULT_LIMITS,
) -> Plan:
    """:func:`load_pipeline` then :func:`compile_pipeline` (errors prefixed with the path)."""
    spec = load_pipeline(path, limits=limits)
    try:
        return compile_pipeline(spec, registry, limits)
    except PipelineError as exc:
        raise PipelineError(exc.problems, source=str(path)) from None


# ---------------------------------------------------------------------------------------
# Building pipelines in Python
# ---------------------------------------------------------------------------------------
class StepRef(str):
    """``${steps.<id>.output}`` as a plain string, usable directly in ``with_`` values and in
    ``depends_on``; ``.at("key", 0)`` points inside the output."""

    step_id: str
    path: tuple[str | int, ...]

    def __new__(cls, step_id: str, path: tuple[str | int, ...] = ()) -> StepRef:
        obj = super().__new__(cls, step_ref(step_id, *path))
        obj.step_id = step_id
        obj.path = path
        return obj

    def at(self, *path: str | int) -> StepRef:
        return StepRef(self.step_id, (*self.path, *path))


class Pipeline:
    """A small builder for pipelines written in Python.

    :meth:`step` returns a :class:`StepRef` (``${steps.<id>.output}``) for later steps'
    ``with_`` values or ``depends_on``; :meth:`build` validates into a :class:`PipelineSpec`.

    Example::

        p = Pipeline(id="demo")
        docs = p.step("split", "echo", with_={"value": ["a", "b"]})
        p.step("first", "template", with_={"template": "$doc", "doc": docs.at(0)})
        plan = p.compile()
    """

    def __init__(
        self,
        id: str,
        *,
        description: str = "",
        failure_policy: Literal["fail_fast", "continue"] = "fail_fast",
        inputs: Mapping[str, Any] | None = None,
        defaults: StepDefaults | Mapping[str, Any] | None = None,
        throttle: Sequence[ThrottleRule | Mapping[str, Any]] = (),
    ) -> None:
        self.id = id
        self._doc: dict[str, Any] = {
            "id": id,
            "description": description,
            "failure_policy": failure_policy,
            "inputs": dict(inputs or {}),
            "throttle": list(throttle),
            "steps": [],
        }
        if defaults is not None:
            self._doc["defaults"] = defaults

    def step(
        self,
        id: str,
        uses: str,
        with_: Mapping[str, Any] | None = None,
        depends_on: Iterable[str] = (),
        **kw: Any,
    ) -> StepRef:
        """Add a step (``kw``: ``retry``, ``timeout_s``, ``concurrency``); returns a
        reference to its output."""
        entry: dict[str, Any] = {
            "id": id,
            "uses": uses,
            "with": dict(with_ or {}),
            "depends_on": [d.step_id if isinstance(d, StepRef) else d for d in depends_on],
        }
        entry.update(kw)
        self._doc["steps"].append(entry)
        return StepRef(id)

    @staticmethod
    def input(name: str, *path: str | int) -> str:
        """``${inputs.<name>[.<path>]}``."""
        return input_ref(name, *path)

    def build(self) -> PipelineSpec:
        return parse_pipeline(self._doc, source=f"pipeline {self.id!r}")

    def compile(
        self, registry: HandlerRegistry | None = None, limits: PipelineLimits = DEFAULT_LIMITS
    ) -> Plan:
        return compile_pipeline(self.build(), registry, limits)
