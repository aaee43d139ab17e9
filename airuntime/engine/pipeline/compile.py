"""The compiler: a validated spec, checked completely, becomes a :class:`Plan`.

:func:`compile_pipeline` runs every check of :mod:`~airuntime.engine.pipeline.checks`
(all problems are reported together), then builds the plan: steps in deterministic
topological order with their dependencies, dependents, retry policy, timeout and
throttle resolved, so workers never interpret the user's format.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airuntime.core.gc_tuning import collector_paused
from airuntime.engine.handlers import HandlerRegistry, default_registry
from airuntime.engine.handlers.model_call import MODEL_HANDLER
from airuntime.engine.handlers.settings import handler_settings
from airuntime.engine.pipeline.checks import (
    SizeBudget,
    check_cycles,
    check_dependencies,
    check_edge_count,
    check_handler,
    check_http_url,
    check_ids,
    check_input_step,
    check_model_call,
    check_python_callable,
    check_references,
    check_run_inputs,
    check_secret_refs,
    check_step_count,
    check_step_inputs,
)
from airuntime.engine.pipeline.loading import load_pipeline
from airuntime.engine.pipeline.plan import Plan, PlanStep, ResolvedThrottle
from airuntime.engine.pipeline.problems import PipelineError, Problem
from airuntime.engine.pipeline.spec import (
    DEFAULT_LIMITS,
    INPUT_HANDLER,
    ConcurrencySpec,
    PipelineLimits,
    PipelineSpec,
    RetryPolicy,
    StepSpec,
    ThrottleRule,
)


@dataclass
class _Graph:
    """What the per-step checks found, by declaration index."""

    deps: list[list[int]]
    """Explicit ``depends_on`` plus referenced steps, sorted."""
    refs: list[list[int]]
    """Steps whose outputs the inputs reference, sorted."""
    inputs: list[Any]
    """Normalised ``with`` (None where it could not be checked)."""
    edges: int = 0


def compile_pipeline(
    spec: PipelineSpec,
    registry: HandlerRegistry | None = None,
    limits: PipelineLimits = DEFAULT_LIMITS,
    *,
    allowed_handlers: Collection[str] | None = None,
    allowed_model_providers: Collection[str] | None = None,
    python_modules: Collection[str] | None = None,
) -> Plan:
    """Check a spec completely and compile it into a :class:`Plan`.

    ``registry`` (default: :func:`~airuntime.engine.handlers.default_registry`) decides which
    ``uses`` names exist; ``allowed_handlers`` (the tenant's allowlist; None = no
    restriction) which of them the pipeline may use; ``allowed_model_providers`` which
    of the platform's model providers its ``model`` steps may call (None = all);
    ``python_modules`` which modules ``python`` steps may call (None = the platform's
    ``AIRUNTIME_PYTHON_HANDLER_MODULES``). Raises :class:`PipelineError` listing every
    problem found.
    """
    registry = default_registry() if registry is None else registry
    if python_modules is None:
        python_modules = handler_settings().python_handler_modules
    rules = _StepRules(
        known=frozenset(registry.names()),
        allowed=None if allowed_handlers is None else frozenset(allowed_handlers),
        python_modules=tuple(python_modules),
        model_providers=(
            None if allowed_model_providers is None else frozenset(allowed_model_providers)
        ),
    )
    check_step_count(spec.steps, limits)
    with collector_paused():  # a large plan is many objects, none of them garbage
        return _compile(spec, rules, limits)


def _compile(spec: PipelineSpec, rules: _StepRules, limits: PipelineLimits) -> Plan:
    """:func:`compile_pipeline`'s checks and build, once the step count is known to be
    within the limit."""
    problems: list[Problem] = []
    first = check_ids(spec.steps, problems)
    budget = SizeBudget(limits.max_pipeline_bytes)
    run_inputs = check_run_inputs(spec.inputs, budget, problems)
    graph = _check_steps(spec.steps, rules, first, budget, limits, problems)
    check_edge_count(graph.edges, limits, problems)
    topo = check_cycles(spec.steps, first, graph.deps, problems)
    if problems:
        raise PipelineError(problems)
    return _build_plan(spec, run_inputs, graph, topo, limits)


@dataclass(frozen=True)
class _StepRules:
    """What decides whether a step's handler may be used, and how."""

    known: Set[str]
    """Registered handler names."""
    allowed: Set[str] | None
    """The tenant's handler allowlist (None = no restriction)."""
    python_modules: tuple[str, ...]
    """Modules ``python`` steps may call."""
    model_providers: Set[str] | None
    """Model providers the tenant's ``model`` steps may call (None = all the platform's)."""

    def usable(self, handler: str) -> bool:
        """The handler exists and the tenant may use it (its inputs are worth checking)."""
        return handler in self.known and (self.allowed is None or handler in self.allowed)


def _check_steps(
    steps: Sequence[StepSpec],
    rules: _StepRules,
    first: dict[str, int],
    budget: SizeBudget,
    limits: PipelineLimits,
    problems: list[Problem],
) -> _Graph:
    """Every per-step check, step by step (so problems come in declaration order)."""
    graph = _Graph(deps=[[] for _ in steps], refs=[[] for _ in steps], inputs=[None] * len(steps))
    for i, s in enumerate(steps):
        check_handler(i, s, rules.known, problems, rules.allowed)
        explicit = check_dependencies(i, s, first, problems)
        value, checked = check_step_inputs(i, s, budget, limits, problems)
        graph.inputs[i] = value
        if checked and rules.usable(s.uses):
            check_python_callable(i, s, value, rules.python_modules, problems)
            check_http_url(i, s, value, problems)
            check_model_call(i, s, value, problems, rules.model_providers)
        if checked:
            check_secret_refs(i, s, value, problems)
        referenced = check_references(i, s, value, first, problems) if checked else set()
        check_input_step(i, s, problems)
        graph.refs[i] = sorted(referenced)
        graph.deps[i] = sorted(explicit | referenced)
        graph.edges += len(graph.deps[i])
    return graph


def _build_plan(
    spec: PipelineSpec,
    run_inputs: dict[str, Any],
    graph: _Graph,
    topo: Sequence[int],
    limits: PipelineLimits,
) -> Plan:
    steps = spec.steps
    position = {decl: pos for pos, decl in enumerate(topo)}
    children: list[list[int]] = [[] for _ in steps]
    for decl in topo:  # visiting in plan order keeps every children list sorted
        for d in graph.deps[decl]:
            children[d].append(decl)

    def ids(decls: Iterable[int]) -> tuple[str, ...]:
        return tuple(steps[d].id for d in sorted(decls, key=position.__getitem__))

    plan_steps: list[PlanStep] = []
    for pos, decl in enumerate(topo):
        s = steps[decl]
        retry, timeout_s = _attempt_rules(spec, s)
        concurrency = s.concurrency or _model_concurrency(s, graph.inputs[decl])
        plan_steps.append(
            PlanStep(
                id=s.id,
                order=pos,
                handler=s.uses,
                inputs=graph.inputs[decl],
                deps=ids(graph.deps[decl]),
                refs=ids(graph.refs[decl]),
                children=tuple(steps[c].id for c in children[decl]),
                retry=retry,
                timeout_s=timeout_s,
                concurrency=concurrency,
                throttle=_resolve_throttle(concurrency, spec.throttle),
                is_input=s.uses == INPUT_HANDLER,
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


_SINGLE_ATTEMPT = RetryPolicy()


def _attempt_rules(spec: PipelineSpec, step: StepSpec) -> tuple[RetryPolicy, float | None]:
    """The step's retry policy and timeout: its own, else the pipeline defaults (``input``
    steps take no defaults: they are never attempted on a worker)."""
    if step.uses == INPUT_HANDLER:
        return step.retry or _SINGLE_ATTEMPT, step.timeout_s
    retry = step.retry or spec.defaults.retry or _SINGLE_ATTEMPT
    timeout_s = step.timeout_s if step.timeout_s is not None else spec.defaults.timeout_s
    return retry, timeout_s


def _model_concurrency(step: StepSpec, inputs: Any) -> ConcurrencySpec | None:
    """A ``model`` step without a ``concurrency`` of its own consumes its provider and
    model (operation ``chat``), so the pipeline's ``throttle`` rules apply to it as
    written (``match: {provider: openai}``)."""
    if step.uses != MODEL_HANDLER or not isinstance(inputs, Mapping):
        return None
    return ConcurrencySpec(
        provider=inputs.get("provider"), model=inputs.get("model"), operation="chat"
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
