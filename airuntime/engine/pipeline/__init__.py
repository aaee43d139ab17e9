"""The pipeline format and its compiler.

Why this package exists: a pipeline arrives as untrusted YAML, JSON or Python objects, but the
engine and every worker need a graph they can trust blindly.  This package is the single gate
between the two.  It defines the user-facing format (:mod:`.spec`: pydantic models, unknown
fields rejected), reads it strictly (:mod:`.loading`), checks *everything* that can be
checked statically -- handler names, ids, dependencies, references between steps, cycles,
sizes (:mod:`.checks`) -- before anything is written to Redis, and compiles the result
(:mod:`.compile`) into a :class:`Plan` (:mod:`.plan`): plain frozen dataclasses in a
deterministic topological order, serialisable to canonical JSON so that workers in other
processes rebuild exactly the same plan (and can compare digests). :mod:`.plan_cache`
keeps one plan per document for its many runs; :mod:`.builder` writes pipelines in Python.

Every problem is reported as a :class:`PipelineError` whose lines read
``<location>: <what is wrong> (value=...)``, all problems at once where practical.
"""

from airuntime.engine.pipeline.builder import Pipeline, StepRef
from airuntime.engine.pipeline.compile import compile_pipeline, load_plan
from airuntime.engine.pipeline.loading import load_pipeline, parse_pipeline
from airuntime.engine.pipeline.plan import (
    PLAN_FORMAT,
    Plan,
    PlanStep,
    ResolvedThrottle,
    plan_json_of,
)
from airuntime.engine.pipeline.plan_cache import PlanCache
from airuntime.engine.pipeline.problems import PipelineError, Problem
from airuntime.engine.pipeline.spec import (
    DEFAULT_LIMITS,
    INPUT_HANDLER,
    ConcurrencySpec,
    PipelineLimits,
    PipelineSpec,
    RetryPolicy,
    StepDefaults,
    StepSpec,
    ThrottleMatch,
    ThrottleRule,
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
    "PlanCache",
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
    "plan_json_of",
]
