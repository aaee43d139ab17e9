"""Writing pipelines in Python: the :class:`Pipeline` builder and :class:`StepRef`.

The builder produces the same document a YAML file would and validates it through the
same path, so a pipeline built in Python gets the same checks and messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.pipeline.compile import compile_pipeline
from airuntime.engine.pipeline.loading import parse_pipeline
from airuntime.engine.pipeline.plan import Plan
from airuntime.engine.pipeline.spec import (
    DEFAULT_LIMITS,
    PipelineLimits,
    PipelineSpec,
    StepDefaults,
    ThrottleRule,
)
from airuntime.engine.references import input_ref, step_ref


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
