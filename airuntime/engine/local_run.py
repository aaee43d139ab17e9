"""Run one pipeline to its end from this process: the engine of ``airt run``.

Creates the execution in Redis (the embedded server by default), then lets a
:class:`~airuntime.engine.worker_pool.WorkerPool` with N workers advance it, optionally
together with workers in other processes (``airt worker EXECUTION_ID``). Progress is
reported through a callback so the CLI can draw it; ``input`` steps are answered
through another callback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airuntime.core.context import ExecutionContextSnapshot
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.pipeline import Plan
from airuntime.engine.status import ExecutionStatus, StepStatus
from airuntime.engine.store_results import ExecutionInfo
from airuntime.engine.tenant_secrets import GivenSecrets
from airuntime.engine.worker_pool import PoolSettings, WorkerPool

ProgressCallback = Callable[[ExecutionInfo], None]
InputCallback = Callable[[str, str], Awaitable[Any]]
"""(execution_id, step_id) -> value for an ``input`` step; raise :class:`NoInputAvailable`
to cancel the execution instead."""


class NoInputAvailable(Exception):
    """Raised by an input callback that cannot answer; the execution is cancelled."""


@dataclass(frozen=True, slots=True)
class LocalRunResult:
    execution_id: str
    status: ExecutionStatus
    snapshot: dict[str, Any]


async def run_plan(
    store: ExecutionStore,
    plan: Plan,
    *,
    workers: int = 4,
    inputs: Mapping[str, Any] | None = None,
    context: ExecutionContextSnapshot | None = None,
    registry: HandlerRegistry | None = None,
    settings: PoolSettings | None = None,
    on_progress: ProgressCallback | None = None,
    on_input: InputCallback | None = None,
    progress_interval_s: float = 0.1,
    secrets: Mapping[str, str] | None = None,
) -> LocalRunResult:
    """Create an execution of ``plan`` and run it here until it is finalized
    (``secrets``: the values its ``http`` steps' headers name, instead of its tenant's
    stored ones)."""
    eid = await store.create(plan, context=context, inputs=inputs)
    given = GivenSecrets(secrets) if secrets is not None else None
    pool = WorkerPool(store, registry, settings or PoolSettings(workers=workers), secrets=given)
    run = asyncio.create_task(pool.run(eid, workers=workers))
    answered: set[str] = set()
    try:
        while not run.done():
            info = await store.info(eid)
            if on_progress is not None:
                on_progress(info)
            if info.status is ExecutionStatus.WAITING_FOR_INPUT and on_input is not None:
                states = await store.step_states(eid)
                for step, state in states.items():
                    if state is StepStatus.INPUT_WAIT and step not in answered:
                        answered.add(step)
                        try:
                            value = await on_input(eid, step)
                        except NoInputAvailable as exc:
                            await store.cancel(eid, actor=f"no input for {step!r}: {exc}")
                            break
                        await store.provide_input(eid, step, value, actor="cli")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(run), progress_interval_s)
        status = run.result()
    finally:
        if not run.done():
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
    if on_progress is not None:
        on_progress(await store.info(eid))
    snapshot = await store.snapshot(eid) or {}
    return LocalRunResult(eid, status, snapshot)
