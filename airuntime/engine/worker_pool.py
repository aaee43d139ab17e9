"""asyncio workers that advance executions by claiming, running and completing steps.

A :class:`WorkerPool` is stateless with respect to the execution: everything it
knows it learns from claims, and everything it changes goes through the Lua scripts
(:mod:`airuntime.engine.execution_store`). Any number of pools, in any number of processes
and hosts, may participate in the same execution; the result does not depend on
which of them ran what. Each :meth:`WorkerPool.run` is one
:class:`~airuntime.engine.participation.Participation` (the claim/run/report loop, and
how it rides out Redis outages and stops cancelled steps).

The pool itself owns what its participations share: the worker settings and counters,
the handler registry, the concurrency leases and policies, the step slots, one
subscription to the control channel (:mod:`~airuntime.engine.control_feed`), whose
notices it hands to the participations of the execution they name, and one periodic
control-state read for all of them (:mod:`~airuntime.engine.control_poll`), both held
while the pool participates in anything.

A step task cancelled by anything other than the pool itself is treated as a
crashed worker: nothing is reported, its claim and concurrency lease are left to
expire, and another worker recovers the step with its attempt count unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airuntime.core.transient import retry_transient
from airuntime.engine.concurrency import AdmissionPolicy, ConcurrencyLeases, ZeroLimitPolicy
from airuntime.engine.control_feed import ControlFeed
from airuntime.engine.control_poll import ControlPoll
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, default_registry
from airuntime.engine.model_budget import ModelBudgets
from airuntime.engine.participation import Participation
from airuntime.engine.payloads import PayloadOffload
from airuntime.engine.pipeline import Plan
from airuntime.engine.pool_settings import (
    AttemptOutcome,
    PoolSettings,
    PoolStats,
    StepObserver,
    StepSlots,
)
from airuntime.engine.status import ExecutionStatus
from airuntime.engine.store_results import ClaimBatch
from airuntime.engine.tenant_secrets import SecretSource, TenantSecrets

__all__ = [
    "AttemptOutcome",
    "KnownExecution",
    "PoolSettings",
    "PoolStats",
    "StepObserver",
    "StepSlots",
    "WorkerPool",
    "default_pool_id",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KnownExecution:
    """An execution as the process that just created it knows it: the plan it stored,
    the inputs it runs with (:func:`~airuntime.engine.execution_store.merged_inputs`)
    and its tenant (the context snapshot's). Joining with it skips three reads."""

    plan: Plan
    run_inputs: dict[str, Any]
    tenant_id: str
    claimed: ClaimBatch | None = None
    """What the creating call claimed for this pool
    (:meth:`~airuntime.engine.execution_store.ExecutionStore.create_and_claim`), at most
    the participation's workers."""
    claimed_at: float = 0.0
    """``loop.time()`` when that call was sent: the claims' leases count from it."""


def default_pool_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class WorkerPool:
    """Runs steps of executions it is asked to participate in."""

    def __init__(
        self,
        store: ExecutionStore,
        registry: HandlerRegistry | None = None,
        settings: PoolSettings | None = None,
        *,
        pool_id: str | None = None,
        leases: ConcurrencyLeases | None = None,
        policies: Sequence[AdmissionPolicy] = (ZeroLimitPolicy(),),
        slots: StepSlots | None = None,
        observer: StepObserver | None = None,
        payloads: PayloadOffload | None = None,
        secrets: SecretSource | None = None,
    ) -> None:
        self.store = store
        self.payloads = payloads
        """Large outputs to a durable payload store (None: every output stays in Redis)."""
        self.secrets: SecretSource = secrets or TenantSecrets(store.redis, store.scripts)
        """The tenants' secrets, read when an ``http`` step's headers name one."""
        self.model_budgets = ModelBudgets(store.redis, store.scripts)
        """The tenants' model token budgets, drawn from by ``model`` steps."""
        self.registry = registry or default_registry()
        self.settings = settings or PoolSettings()
        self.pool_id = pool_id or default_pool_id()
        self.leases = leases or ConcurrencyLeases(store.redis, store.scripts)
        self.policies = tuple(policies)
        self.slots = slots
        self.observer = observer
        self.stats = PoolStats()
        self.control_feed: ControlFeed | None = None
        """The control-channel subscription while the pool participates in anything."""
        self.control_poll: ControlPoll | None = None
        """The periodic control-state read while the pool participates in anything."""
        self._participations: dict[str, set[Participation]] = {}
        self._held = False

    async def run(
        self,
        execution_id: str,
        *,
        workers: int | None = None,
        known: KnownExecution | None = None,
    ) -> ExecutionStatus:
        """Participate in ``execution_id`` until it is finalized; return its terminal status.
        A Redis outage delays this (the participation waits for the server), it does not
        end it. ``known``: what the caller that created the execution holds (its plan,
        inputs and tenant), so joining reads nothing back from Redis."""
        n = workers if workers is not None else self.settings.workers
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        if known is not None:
            first = None
            if known.claimed is not None:
                if len(known.claimed.claims) > n:
                    raise ValueError(
                        f"{len(known.claimed.claims)} steps were claimed for {n} workers"
                    )
                first = (known.claimed, known.claimed_at)
            participation = Participation(
                self, execution_id, known.plan, known.run_inputs, known.tenant_id, n, first
            )
        else:
            participation = await retry_transient(
                lambda: self._participation(execution_id, n),
                what=f"joining {execution_id}",
                backoff=self.settings.redis_backoff,
                on_error=self._redis_error,
            )
        self._resolve_handlers(participation.plan)
        self._enter(participation)
        try:
            return await participation.run()
        finally:
            await self._leave(participation)

    async def _participation(self, execution_id: str, workers: int) -> Participation:
        plan = await self.store.load_plan(execution_id)
        run_inputs = await self.store.run_inputs(execution_id)
        info = await self.store.info(execution_id)
        return Participation(self, execution_id, plan, run_inputs, info.tenant_id, workers)

    def _resolve_handlers(self, plan: Plan) -> None:
        """Look up the plan's handlers before claiming anything: the first lookup of a
        name reads the entry points and imports the handler's module (~20 ms in a
        worker process on a 2-core VM), which would otherwise happen while the first
        claimed steps' leases run. A name that does not resolve is left alone here: its
        step fails when it runs, with the lookup's error, as before."""
        for name in {step.handler for step in plan.steps}:
            try:
                self.registry.get(name)
            except Exception as exc:  # the step reports it (StepRun._execute)
                log.debug("handler %r of %s does not resolve yet: %s", name, plan.pipeline_id, exc)

    def _redis_error(self, exc: BaseException) -> None:
        self.stats.redis_errors += 1

    def hold(self) -> None:
        """Keep the control feed and the control poll while the pool participates in
        nothing, until :meth:`release`: a runtime instance, whose runs come and go, keeps
        one subscription for its life instead of subscribing again for every burst."""
        self._held = True
        self._start_shared()

    async def release(self) -> None:
        """End :meth:`hold`; the feed and the poll stop once no participation is left."""
        self._held = False
        if not self._participations:
            await self._stop_shared()

    def _enter(self, participation: Participation) -> None:
        self._participations.setdefault(participation.eid, set()).add(participation)
        self._start_shared()

    def _start_shared(self) -> None:
        if self.settings.control_feed and self.control_feed is None:
            self.control_feed = ControlFeed(
                self.store.redis,
                self._notice,
                owner=self.pool_id,
                backoff=self.settings.redis_backoff,
            )
            self.control_feed.start()
        if self.control_poll is None:
            self.control_poll = ControlPoll(
                self.store,
                self._all_participations,
                every_s=self.settings.control_poll_ms / 1000,
                owner=self.pool_id,
                backoff=self.settings.redis_backoff,
            )
            self.control_poll.start()

    async def _leave(self, participation: Participation) -> None:
        group = self._participations.get(participation.eid)
        if group is not None:
            group.discard(participation)
            if not group:
                del self._participations[participation.eid]
        if not self._participations and not self._held:
            await self._stop_shared()

    async def _stop_shared(self) -> None:
        # Shielded: a second cancel of the caller must not leave them running.
        if self.control_feed is not None:
            feed, self.control_feed = self.control_feed, None
            await asyncio.shield(feed.stop())
        if self.control_poll is not None:
            poll, self.control_poll = self.control_poll, None
            await asyncio.shield(poll.stop())

    def _all_participations(self) -> list[Participation]:
        return [p for group in self._participations.values() for p in group]

    def _notice(self, execution_id: str | None) -> None:
        """A control notice for ``execution_id`` (None: for every execution)."""
        if execution_id is None:
            targets = self._all_participations()
        else:
            targets = list(self._participations.get(execution_id, ()))
        for participation in targets:
            participation.control_notice()
