"""Compiled plans kept per pipeline document, so many runs of one pipeline compile once.

Why this exists: every run of a pipeline is compiled three times on its way to a worker
-- at submit (the tenant's allowlist), at the runtime's intake and when the run starts
-- and its plan is written as canonical JSON with a sha256 digest. For the many small
runs of one pipeline that a control plane dispatches, parsing, checking, building and
serialising the same document again was about half a millisecond of Python per run on
the dispatch path (``python -m benchmarks.dispatch``, cProfile), a tenth of the runtime's
share. A :class:`Plan` is immutable, so one compiled plan serves every run of the same
document under the same rules.

The key is everything :func:`~airuntime.engine.pipeline.compile.compile_pipeline`
decides by: the document (canonical JSON), the tenant's handler allowlist, the
registry's handler names and the handler settings of the environment (the ``python``
modules, the HTTP egress policy), so a changed allowlist or setting compiles again at
once. Refusals are never kept (a hostile document is re-checked and refused each time).
The cache is bounded by entries and by the steps it holds, least recently used first
out, so a tenant sending many distinct or huge pipelines costs memory only within the
bound; a plan larger than the step budget is compiled and not kept.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any, Final

from airuntime.engine.handlers import HandlerRegistry, default_registry
from airuntime.engine.handlers.settings import HandlerSettings, handler_settings
from airuntime.engine.pipeline.compile import compile_pipeline
from airuntime.engine.pipeline.loading import parse_pipeline
from airuntime.engine.pipeline.plan import Plan

__all__ = ["PlanCache"]

MAX_PLANS: Final = 256
MAX_STEPS: Final = 50_000

_Key = tuple[str, frozenset[str] | None, frozenset[str] | None, tuple[str, ...], int]


class PlanCache:
    """Plans compiled against one handler registry, least recently used out first."""

    def __init__(
        self,
        registry: HandlerRegistry | None = None,
        *,
        max_plans: int = MAX_PLANS,
        max_steps: int = MAX_STEPS,
    ) -> None:
        self.registry = default_registry() if registry is None else registry
        self.max_plans = max_plans
        self.max_steps = max_steps
        self._plans: OrderedDict[_Key, tuple[HandlerSettings, Plan]] = OrderedDict()
        self._steps = 0
        self._lock = threading.Lock()  # sync step handlers run in threads
        self.hits = 0
        self.misses = 0

    def compile(
        self,
        pipeline: Mapping[str, Any],
        *,
        allowed_handlers: Collection[str] | None = None,
        allowed_model_providers: Collection[str] | None = None,
    ) -> Plan:
        """The plan of ``pipeline`` for a tenant with ``allowed_handlers`` and
        ``allowed_model_providers`` (None = no restriction); raises
        :class:`~airuntime.engine.pipeline.problems.PipelineError` exactly as
        :func:`compile_pipeline` does."""
        settings = handler_settings()
        allowed = None if allowed_handlers is None else frozenset(allowed_handlers)
        providers = None if allowed_model_providers is None else frozenset(allowed_model_providers)
        try:
            document = json.dumps(pipeline, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError):
            # Not plain JSON: the parser names the problem; nothing is kept.
            return self._compile(pipeline, allowed, providers)
        # id(settings) stays unique while the entry holds the settings object.
        key: _Key = (document, allowed, providers, tuple(self.registry.names()), id(settings))
        with self._lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return found[1]
        plan = self._compile(pipeline, allowed, providers)
        with self._lock:
            self.misses += 1
            if len(plan.steps) <= self.max_steps and key not in self._plans:
                self._plans[key] = (settings, plan)
                self._steps += len(plan.steps)
                while len(self._plans) > self.max_plans or self._steps > self.max_steps:
                    _, (_, old) = self._plans.popitem(last=False)
                    self._steps -= len(old.steps)
        return plan

    def _compile(
        self,
        pipeline: Mapping[str, Any],
        allowed: Collection[str] | None,
        providers: Collection[str] | None,
    ) -> Plan:
        return compile_pipeline(
            parse_pipeline(pipeline),
            self.registry,
            allowed_handlers=allowed,
            allowed_model_providers=providers,
        )

    def __len__(self) -> int:
        return len(self._plans)
