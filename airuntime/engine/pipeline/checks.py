"""The static checks of a pipeline spec, one small function per rule.

Each check appends the :class:`~airuntime.engine.pipeline.problems.Problem`\\ s it finds to
one shared list, so a user sees every mistake at once, and returns what later checks
and the compiler need (indexes of declared steps, normalised inputs, dependencies).
Steps are referred to by their declaration index. Two checks raise at once instead:
too many steps or edges make everything after them too expensive to check.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Collection, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from airuntime.engine.handlers.model_call import MODEL_HANDLER, call_problems
from airuntime.engine.handlers.python_policy import callable_problem, describe_allowed
from airuntime.engine.handlers.settings import handler_settings
from airuntime.engine.pipeline.graph import find_cycle, topological_order
from airuntime.engine.pipeline.problems import PipelineError, Problem, fmt_value, format_loc
from airuntime.engine.pipeline.spec import INPUT_HANDLER, PipelineLimits, StepSpec
from airuntime.engine.pipeline.values import BadValue, normalize_json
from airuntime.engine.references import ReferenceSyntaxError, iter_strings, parse_references
from airuntime.engine.secret_refs import secret_problem


@dataclass
class SizeBudget:
    """JSON-encoded bytes the run inputs and all steps' ``with`` may still use together
    (``max_pipeline_bytes``); ``left`` is -1 once that is exceeded: measuring stops."""

    left: int


def check_step_count(steps: Sequence[StepSpec], limits: PipelineLimits) -> None:
    if len(steps) > limits.max_steps:
        raise PipelineError(
            [Problem("steps", f"{len(steps)} steps is over the limit of {limits.max_steps}")]
        )


def check_ids(steps: Sequence[StepSpec], problems: list[Problem]) -> dict[str, int]:
    """Step id -> index of its first declaration; later duplicates are problems."""
    first: dict[str, int] = {}
    for i, s in enumerate(steps):
        if s.id in first:
            where = f"steps[{first[s.id]}] and steps[{i}]"
            problems.append(Problem("steps", f"duplicate step id {s.id!r} ({where})"))
        else:
            first[s.id] = i
    return first


def check_run_inputs(
    inputs: dict[str, Any], budget: SizeBudget, problems: list[Problem]
) -> dict[str, Any]:
    """The pipeline's ``inputs``, normalised ({} if they are invalid)."""
    try:
        run_inputs, used = normalize_json(inputs, budget.left)
    except BadValue as bad:
        message = bad.message
        if bad.too_big:
            message = f"{bad.message} JSON-encoded is over the limit of {budget.left} bytes"
        problems.append(Problem(format_loc(("inputs", *bad.loc)), message))
        budget.left = -1
        return {}
    budget.left -= used
    return dict(run_inputs)


def check_handler(
    i: int,
    step: StepSpec,
    known: Set[str],
    problems: list[Problem],
    allowed: Set[str] | None = None,
) -> None:
    """``uses`` names a registered handler, and one the tenant may use (``allowed``;
    None = no restriction, e.g. ``airt run`` on one's own machine)."""
    if step.uses in known:
        if allowed is not None and step.uses not in allowed:
            problems.append(
                Problem(
                    f"steps[{i}].uses",
                    f"handler {step.uses!r} is not allowed for this tenant "
                    f"(allowed: {', '.join(sorted(allowed)) or 'none'})",
                )
            )
        return
    names = sorted(known)
    hint = difflib.get_close_matches(step.uses, names, n=1)
    problems.append(
        Problem(
            f"steps[{i}].uses",
            f"unknown handler {step.uses!r} (known: {', '.join(names) or 'none'})"
            + (f"; did you mean {hint[0]!r}?" if hint else ""),
        )
    )


def check_dependencies(
    i: int, step: StepSpec, first: Mapping[str, int], problems: list[Problem]
) -> set[int]:
    """The declared steps ``depends_on`` names (unknown ones and the step itself are problems)."""
    explicit: set[int] = set()
    for dep in step.depends_on:
        if dep == step.id:
            problems.append(
                Problem(f"steps[{i}].depends_on", f"step {step.id!r} depends on itself")
            )
        elif dep not in first:
            problems.append(Problem(f"steps[{i}].depends_on", f"unknown step {dep!r}"))
        else:
            explicit.add(first[dep])
    return explicit


def check_step_inputs(
    i: int, step: StepSpec, budget: SizeBudget, limits: PipelineLimits, problems: list[Problem]
) -> tuple[Any, bool]:
    """The step's ``with``, normalised, and whether it could be checked (it cannot once
    the pipeline is over its size budget, or when it is invalid)."""
    if budget.left < 0:
        return None, False
    cap = min(limits.max_input_bytes, budget.left)
    try:
        value, used = normalize_json(step.with_, cap)
    except BadValue as bad:
        where = f"steps[{i}]"
        if not bad.too_big:
            problems.append(Problem(format_loc(("steps", i, "with", *bad.loc)), bad.message))
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
            budget.left = -1
        return None, False
    budget.left -= used
    return value, True


def check_references(
    i: int, step: StepSpec, value: Any, first: Mapping[str, int], problems: list[Problem]
) -> set[int]:
    """The declared steps whose outputs the ``${steps.<id>.output}`` references in
    ``value`` (the step's normalised ``with``) read."""
    referenced: set[int] = set()
    for sub, text in iter_strings(value):
        if "${" not in text:
            continue
        at = format_loc(("steps", i, "with", *sub))
        try:
            found = parse_references(text)
        except ReferenceSyntaxError as exc:
            problems.append(Problem(at, f"{exc.detail} in {exc.reference!r}"))
            continue
        for ref in found:
            if ref.source != "steps":
                continue
            if ref.name == step.id:
                problems.append(
                    Problem(at, f"step {step.id!r} references its own output in {ref.text!r}")
                )
            elif ref.name not in first:
                problems.append(
                    Problem(at, f"reference to unknown step {ref.name!r} in {ref.text!r}")
                )
            else:
                referenced.add(first[ref.name])
    return referenced


def check_input_step(i: int, step: StepSpec, problems: list[Problem]) -> None:
    """``input`` steps never run on a worker: no retries, no concurrency spec."""
    if step.uses != INPUT_HANDLER:
        return
    if step.retry is not None and step.retry.max_attempts > 1:
        problems.append(
            Problem(
                f"steps[{i}].retry.max_attempts",
                f"'input' steps cannot be retried (value={step.retry.max_attempts})",
            )
        )
    if step.concurrency is not None:
        problems.append(
            Problem(
                f"steps[{i}].concurrency",
                "not allowed on 'input' steps, they never run on a worker "
                f"(value={fmt_value(step.concurrency.model_dump(exclude_none=True))})",
            )
        )


PYTHON_HANDLER = "python"


def check_python_callable(
    i: int, step: StepSpec, value: Any, modules: Collection[str], problems: list[Problem]
) -> None:
    """A ``python`` step names, as a literal, a callable of a module the platform allows
    (``modules``: ``AIRUNTIME_PYTHON_HANDLER_MODULES``); checked again when it runs."""
    if step.uses != PYTHON_HANDLER or not isinstance(value, Mapping):
        return
    spec = value.get("callable")
    if isinstance(spec, str) and "${" in spec:
        problems.append(
            Problem(
                f"steps[{i}].with.callable",
                f"step {step.id!r}: the callable must be written out, not a reference "
                f"(value={spec!r}; {describe_allowed(modules)})",
            )
        )
        return
    problem = callable_problem(spec, modules)
    if problem is not None:
        problems.append(Problem(f"steps[{i}].with.callable", f"step {step.id!r}: {problem}"))


HTTP_HANDLER = "http"


def check_http_url(i: int, step: StepSpec, value: Any, problems: list[Problem]) -> None:
    """An ``http`` step whose literal URL names an address the platform's egress policy
    refuses (``127.0.0.1``, ``169.254.169.254``, ``localhost``, a private network ...) is
    refused at submit; a host name is resolved, and refused, when the step runs."""
    if step.uses != HTTP_HANDLER or not isinstance(value, Mapping):
        return
    url = value.get("url")
    if not isinstance(url, str) or "${" in url:
        return
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return  # malformed: the handler refuses it, naming the url
    if not host:
        return
    local = host == "localhost" or host.endswith(".localhost")
    try:
        addresses = ["127.0.0.1"] if local else [str(ipaddress.ip_address(host))]
    except ValueError:
        return  # a name: checked on the address it resolves to, when the step runs
    from airuntime.engine.handlers.egress import EgressPolicy  # httpx: only when needed

    policy = EgressPolicy.from_settings(handler_settings())
    refusal = policy.refusal(host, addresses)
    if refusal is not None:
        where = f"steps[{i}].with.url"
        problems.append(Problem(where, f"step {step.id!r}: url {url!r}: {refusal}"))


def check_secret_refs(i: int, step: StepSpec, value: Any, problems: list[Problem]) -> None:
    """``${secrets.NAME}`` only in an ``http`` step's header values, well formed, and in
    a header naming nothing else (:mod:`~airuntime.engine.secret_refs`); whether the
    tenant has stored the names is checked where the tenant is known (the submit)."""
    for sub, text in iter_strings(value):
        problem = secret_problem(step.uses, sub, text)
        if problem is not None:
            at = format_loc(("steps", i, "with", *sub))
            problems.append(Problem(at, f"step {step.id!r}: {problem}"))


def check_model_call(
    i: int,
    step: StepSpec,
    value: Any,
    problems: list[Problem],
    allowed: Collection[str] | None = None,
) -> None:
    """A ``model`` step names, written out, a provider of ``AIRUNTIME_MODEL_PROVIDERS``
    the tenant may call (``allowed``; None: all) and a model it offers, with a prompt or
    messages and options in range; checked again, references resolved, when it runs
    (:mod:`~airuntime.engine.handlers.model_call`)."""
    if step.uses != MODEL_HANDLER:
        return
    providers = handler_settings().model_providers
    for field, message in call_problems({} if value is None else value, providers, allowed):
        where = f"steps[{i}].with.{field}" if field else f"steps[{i}].with"
        problems.append(Problem(where, f"step {step.id!r}: {message}"))


def check_edge_count(edges: int, limits: PipelineLimits, problems: list[Problem]) -> None:
    if edges > limits.max_edges:
        problems.append(
            Problem("steps", f"{edges} dependencies is over the limit of {limits.max_edges}")
        )
        raise PipelineError(problems)


def check_cycles(
    steps: Sequence[StepSpec],
    first: Mapping[str, int],
    deps: Sequence[Sequence[int]],
    problems: list[Problem],
) -> list[int]:
    """The declared steps in topological order; a cycle is a problem naming its steps."""
    nodes = sorted(first.values())
    topo = topological_order(nodes, deps)
    if len(topo) < len(nodes):
        done = [False] * len(steps)
        for i in topo:
            done[i] = True
        cycle = [steps[i].id for i in find_cycle(nodes, deps, done)]
        if len(cycle) > 20:
            cycle = [*cycle[:10], f"... {len(cycle) - 20} more ...", *cycle[-10:]]
        path = " -> ".join([*cycle, cycle[0]])
        problems.append(Problem("steps", f"dependency cycle {path} (x -> y: x depends on y)"))
    return topo
