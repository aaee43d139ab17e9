"""Behaviour of the per-instance FIFO step slot controller.

Ordering and concurrency are established with ``asyncio.Event`` latches and by yielding to
the loop a bounded number of times (``settle``/``until``), never with timed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime_pod.step_slots import (
    Outcome,
    SlotControllerClosed,
    SlotEvidence,
    StepSlotController,
)

SETTLE_YIELDS = 20


async def settle() -> None:
    """Let every runnable task advance as far as it can (bounded number of loop turns)."""
    for _ in range(SETTLE_YIELDS):
        await asyncio.sleep(0)


async def until(predicate: Callable[[], bool], *, max_yields: int = 500) -> None:
    for _ in range(max_yields):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached within the yield budget")


class FatalStepError(BaseException):
    """A BaseException that is neither Exception nor cancellation (like Java's Error)."""


class Step:
    """A step handler that holds its slot until ``release`` is set (a latch)."""

    def __init__(
        self,
        controller: StepSlotController,
        execution_id: str,
        name: str,
        log: list[str] | None = None,
    ) -> None:
        self.controller = controller
        self.execution_id = execution_id
        self.name = name
        self.log = log if log is not None else []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.error: BaseException | None = None
        self.caller_finally_ran = False
        self.task: asyncio.Task[None] | None = None
        self.arrived = False

    async def _run(self) -> None:
        self.arrived = True
        try:
            async with self.controller.slot(self.execution_id):
                self.log.append(self.name)
                self.entered.set()
                await self.release.wait()
                if self.error is not None:
                    raise self.error
        finally:
            # Stands in for caller-owned resources (input leases) released after the slot.
            self.caller_finally_ran = True

    def start(self) -> Step:
        self.task = asyncio.create_task(self._run(), name=self.name)
        return self

    @property
    def running(self) -> asyncio.Task[None]:
        assert self.task is not None
        return self.task


async def start_in_order(steps: Iterable[Step]) -> list[Step]:
    """Start steps one by one, letting each reach the controller before the next."""
    started = []
    for step in steps:
        started.append(step.start())
        await settle()
    return started


async def finish(*steps: Step) -> None:
    for step in steps:
        step.release.set()
    await asyncio.gather(*(s.running for s in steps), return_exceptions=True)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


# -- positive limit, unrestricted default, invalid values ------------------------------


async def test_default_limit_is_unrestricted_and_admits_every_step_at_once() -> None:
    controller = StepSlotController()
    assert controller.limit == 0
    steps = [Step(controller, f"exec-{i % 3}", f"s{i}").start() for i in range(50)]
    await until(lambda: all(s.entered.is_set() for s in steps))
    assert controller.active == 50
    assert controller.queued == 0
    await finish(*steps)
    assert controller.active == 0


async def test_positive_limit_bounds_concurrently_executing_step_handlers() -> None:
    controller = StepSlotController(3)
    steps = await start_in_order(Step(controller, "exec", f"s{i}") for i in range(5))
    assert [s.entered.is_set() for s in steps] == [True, True, True, False, False]
    assert (controller.active, controller.queued) == (3, 2)

    await finish(steps[0])
    await until(lambda: steps[3].entered.is_set())
    assert (controller.active, controller.queued) == (3, 1)
    assert not steps[4].entered.is_set()
    await finish(*steps[1:])
    assert (controller.active, controller.queued) == (0, 0)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(-1, id="negative"),
        pytest.param(True, id="bool-true"),
        pytest.param(False, id="bool-false"),
        pytest.param(4.5, id="float"),
        pytest.param("4", id="string"),
        pytest.param(None, id="none"),
    ],
)
async def test_invalid_limit_values_are_rejected_and_keep_the_current_limit(
    value: object,
) -> None:
    expected = f"max_concurrent_step_tasks must be an integer >= 0, got {value!r}"
    with pytest.raises(ValueError) as from_init:
        StepSlotController(value)  # type: ignore[arg-type]
    assert str(from_init.value) == expected

    controller = StepSlotController(2)
    with pytest.raises(ValueError) as from_update:
        controller.set_limit(value)  # type: ignore[arg-type]
    assert str(from_update.value) == expected
    assert controller.limit == 2


def test_invalid_limit_message_names_the_setting_and_value() -> None:
    with pytest.raises(ValueError, match=r"^max_concurrent_step_tasks must be .*, got -1$"):
        StepSlotController().set_limit(-1)


# -- FIFO admission and independent runtime instances ----------------------------------


async def test_shared_capacity_admits_queued_requests_in_arrival_order() -> None:
    controller = StepSlotController(1)
    log: list[str] = []
    holder = (await start_in_order([Step(controller, "e1", "e1-hold", log)]))[0]
    # A large execution enqueues several tasks before the other execution arrives: FIFO by
    # arrival, not round-robin per execution.
    arrivals = ["e1-a", "e1-b", "e2-a", "e1-c", "e2-b"]
    queued = await start_in_order(Step(controller, n.split("-")[0], n, log) for n in arrivals)
    assert controller.queued == 5

    for step in [holder, *queued]:
        await finish(step)
        await settle()
    assert log == ["e1-hold", *arrivals]


async def test_a_later_arrival_never_bypasses_a_queued_waiter_when_capacity_frees() -> None:
    controller = StepSlotController(1)
    log: list[str] = []
    release_holder = asyncio.Event()
    at_release: list[tuple[int, int]] = []
    newcomer = Step(controller, "e3", "newcomer", log)

    async def holder() -> None:
        async with controller.slot("e1"):
            log.append("holder")
            await release_holder.wait()
        # The instant capacity was freed, the queued waiter already owns it ...
        at_release.append((controller.active, controller.queued))
        # ... so a task arriving right now must queue behind it.
        newcomer.start()

    holding = asyncio.create_task(holder())
    await settle()
    waiter = (await start_in_order([Step(controller, "e2", "waiter", log)]))[0]
    assert controller.queued == 1

    release_holder.set()
    await holding
    await settle()
    assert at_release == [(1, 0)]
    assert log == ["holder", "waiter"]
    assert controller.queued == 1  # the newcomer
    await finish(waiter)
    await until(lambda: newcomer.entered.is_set())
    assert log == ["holder", "waiter", "newcomer"]
    await finish(newcomer)


async def test_separate_controllers_do_not_block_each_other() -> None:
    first = StepSlotController(1)
    second = StepSlotController(1)
    busy = await start_in_order([Step(first, "e1", "a1"), Step(first, "e1", "a2")])
    assert (first.active, first.queued) == (1, 1)

    other = (await start_in_order([Step(second, "e2", "b1")]))[0]
    assert other.entered.is_set()
    assert (second.active, second.queued) == (1, 0)
    await finish(other, *busy)


# -- live increase / decrease / disable -------------------------------------------------


async def test_live_increase_admits_work_and_decrease_drains_without_preempting() -> None:
    controller = StepSlotController(1)
    steps = await start_in_order(Step(controller, "exec", f"s{i}") for i in range(5))
    assert (controller.active, controller.queued) == (1, 4)

    controller.set_limit(3)
    # Woken by the change itself: no polling interval is involved.
    assert (controller.active, controller.queued) == (3, 2)
    await until(lambda: all(s.entered.is_set() for s in steps[:3]))

    controller.set_limit(1)
    await settle()
    assert controller.active == 3  # temporarily above the lowered limit
    assert not any(s.running.done() for s in steps[:3])  # nothing pre-empted

    await finish(steps[0])
    await settle()
    assert (controller.active, controller.queued) == (2, 2)
    await finish(steps[1])
    await settle()
    assert (controller.active, controller.queued) == (1, 2)
    assert not steps[3].entered.is_set()
    await finish(steps[2])
    await until(lambda: steps[3].entered.is_set())
    assert (controller.active, controller.queued) == (1, 1)
    await finish(steps[3], steps[4])
    assert all(not s.running.cancelled() for s in steps)


async def test_disabling_the_limit_releases_waiters_without_replacing_the_controller() -> None:
    controller = StepSlotController(1)
    steps = await start_in_order(Step(controller, f"e{i % 2}", f"s{i}") for i in range(6))
    assert (controller.active, controller.queued) == (1, 5)

    same = controller
    controller.set_limit(0)
    assert (controller.active, controller.queued) == (6, 0)
    await until(lambda: all(s.entered.is_set() for s in steps))
    assert controller is same
    assert steps[0].running.done() is False  # the active step was not lost or restarted

    # Re-enabling applies to new arrivals on the same controller.
    controller.set_limit(2)
    late = (await start_in_order([Step(controller, "e9", "late")]))[0]
    assert not late.entered.is_set()
    await finish(*steps)
    await until(lambda: late.entered.is_set())
    await finish(late)


# -- cancellation ------------------------------------------------------------------------


async def test_cancelling_the_head_waiter_does_not_cancel_another_request() -> None:
    controller = StepSlotController(1)
    holder, head, other = await start_in_order(
        [
            Step(controller, "e1", "holder"),
            Step(controller, "e2", "head"),
            Step(controller, "e3", "other"),
        ]
    )
    assert controller.queued == 2

    head.running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await head.running
    assert controller.queued == 1
    assert not other.running.done()

    await finish(holder)
    await until(lambda: other.entered.is_set())
    assert not head.entered.is_set()
    await finish(other)
    assert not other.running.cancelled()
    head_evidence = controller.evidence("e2")
    assert (head_evidence.admitted, head_evidence.cancelled) == (0, 1)
    assert controller.evidence("e3").succeeded == 1


async def test_cancelling_a_queued_task_skips_the_handler_and_preserves_the_cancellation() -> None:
    controller = StepSlotController(1)
    seen: list[BaseException] = []
    lease_released = asyncio.Event()

    async def queued_step() -> None:
        try:
            async with controller.slot("e2"):
                pytest.fail("the handler of a cancelled queued task must not run")
        except asyncio.CancelledError as exc:
            seen.append(exc)
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 1  # status preserved
            raise
        finally:
            lease_released.set()

    holder = (await start_in_order([Step(controller, "e1", "holder")]))[0]
    task = asyncio.create_task(queued_step())
    await settle()
    assert controller.queued == 1

    task.cancel("execution e2 aborted")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e.args for e in seen] == [("execution e2 aborted",)]
    assert lease_released.is_set()
    assert (controller.active, controller.queued) == (1, 0)
    evidence = controller.evidence("e2")
    assert (evidence.admitted, evidence.cancelled) == (0, 1)
    await finish(holder)


@pytest.mark.parametrize(
    "trigger",
    [
        pytest.param("raise-limit", id="granted-by-limit-increase"),
        pytest.param("holder-release", id="granted-by-slot-release"),
    ],
)
async def test_a_slot_granted_at_the_instant_of_cancellation_is_given_back(
    trigger: str,
) -> None:
    tasks: dict[str, asyncio.Task[None]] = {}

    def cancel_on_grant(execution_id: str, wait_s: float) -> None:
        if trigger == "holder-release" and execution_id == "victim":
            tasks["victim"].cancel()  # same instant as the grant

    controller = StepSlotController(1, on_admit=cancel_on_grant)
    holder, victim, successor = await start_in_order(
        [
            Step(controller, "holder", "holder"),
            Step(controller, "victim", "victim"),
            Step(controller, "successor", "successor"),
        ]
    )
    tasks["victim"] = victim.running

    if trigger == "raise-limit":
        controller.set_limit(2)  # grants the victim's slot synchronously ...
        victim.running.cancel()  # ... and it is cancelled before it could resume
    else:
        await finish(holder)
    with pytest.raises(asyncio.CancelledError):
        await victim.running
    await until(lambda: successor.entered.is_set())

    assert not victim.entered.is_set()
    expected_active = 2 if trigger == "raise-limit" else 1
    assert (controller.active, controller.queued) == (expected_active, 0)
    evidence = controller.evidence("victim")
    assert (evidence.admitted, evidence.cancelled, evidence.succeeded) == (1, 1, 0)
    await finish(holder, successor)
    assert controller.active == 0


async def test_cancelling_an_execution_stops_its_queued_and_running_tasks_only() -> None:
    controller = StepSlotController(2)
    r1, r2, q1, q2 = await start_in_order(
        [
            Step(controller, "e1", "r1"),
            Step(controller, "e1", "r2"),
            Step(controller, "e1", "q1"),
            Step(controller, "e2", "q2"),
        ]
    )
    assert (controller.active, controller.queued) == (2, 2)

    for step in (r1, r2, q1):
        step.running.cancel()
    await until(lambda: q2.entered.is_set())
    assert all(s.running.cancelled() for s in (r1, r2, q1))
    assert not q2.running.done()
    evidence = controller.evidence("e1")
    assert (evidence.admitted, evidence.cancelled, evidence.succeeded) == (2, 3, 0)
    await finish(q2)
    assert controller.evidence("e2").succeeded == 1


async def test_cancellation_swallowed_by_the_handler_is_not_recorded_as_success() -> None:
    controller = StepSlotController(1)
    entered = asyncio.Event()

    async def stubborn_handler() -> str:
        async with controller.slot("e1"):
            entered.set()
            # Cooperative code that swallows the cancellation and returns anyway.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
            return "late result"

    task = asyncio.create_task(stubborn_handler())
    await entered.wait()
    task.cancel()
    assert await task == "late result"
    evidence = controller.evidence("e1")
    assert (evidence.succeeded, evidence.cancelled) == (0, 1)
    assert controller.active == 0


# -- failure outcomes release capacity ---------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "make_error"),
    [
        pytest.param("failed", lambda: ValueError("handler broke"), id="exception"),
        pytest.param("failed", lambda: FatalStepError("fatal"), id="base-exception"),
        pytest.param("cancelled", None, id="cancellation"),
    ],
)
async def test_failures_and_cancellation_release_capacity_and_preserve_their_cause(
    outcome: str, make_error: Callable[[], BaseException] | None
) -> None:
    controller = StepSlotController(1)
    failing, next_step = await start_in_order(
        [Step(controller, "e1", "failing"), Step(controller, "e2", "next")]
    )
    cause = KeyError("root cause")
    if make_error is not None:
        error = make_error()
        error.__cause__ = cause
        failing.error = error
        failing.release.set()
        with pytest.raises(type(error)) as raised:
            await failing.running
        assert raised.value is error
        assert raised.value.__cause__ is cause
    else:
        failing.running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await failing.running

    await until(lambda: next_step.entered.is_set())
    assert controller.active == 1
    evidence = controller.evidence("e1")
    assert evidence.admitted == 1
    assert (evidence.failed, evidence.cancelled) == ((1, 0) if outcome == "failed" else (0, 1))
    await finish(next_step)
    assert controller.active == 0


async def test_a_failing_handler_does_not_affect_the_next_request() -> None:
    controller = StepSlotController(1)

    async def handler(execution_id: str, fail: bool) -> str:
        async with controller.slot(execution_id):
            if fail:
                raise RuntimeError("component failure")
            return "ok"

    with pytest.raises(RuntimeError, match="component failure"):
        await handler("e1", fail=True)
    assert await handler("e2", fail=False) == "ok"
    assert controller.evidence("e1").failed == 1
    assert controller.evidence("e2").succeeded == 1
    assert controller.active == 0


async def test_a_failing_metrics_hook_does_not_leak_slots(caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("metrics backend down")

    controller = StepSlotController(1, on_admit=broken, on_release=broken)
    with caplog.at_level(logging.ERROR, logger="runtime_pod.step_slots"):
        for _ in range(3):
            async with controller.slot("e1"):
                assert controller.active == 1
    assert controller.active == 0
    assert controller.evidence("e1").succeeded == 3
    assert "metrics hook" in caplog.text


async def test_a_slot_context_cannot_be_entered_twice() -> None:
    controller = StepSlotController()
    slot = controller.slot("e1")
    async with slot:
        pass
    with pytest.raises(RuntimeError, match="only once"):
        async with slot:
            pass
    assert controller.active == 0


# -- shutdown ----------------------------------------------------------------------------


async def test_shutdown_wakes_queued_requests_and_rejects_new_work_while_active_drains() -> None:
    controller = StepSlotController(1)
    active, queued_a, queued_b = await start_in_order(
        [
            Step(controller, "e1", "active"),
            Step(controller, "e2", "qa"),
            Step(controller, "e3", "qb"),
        ]
    )
    assert controller.queued == 2

    controller.shutdown()
    assert controller.closed
    for step in (queued_a, queued_b):
        with pytest.raises(SlotControllerClosed, match="shut down") as raised:
            await step.running
        assert raised.value.execution_id == step.execution_id
        assert step.execution_id in str(raised.value)
        assert not step.entered.is_set()
    assert controller.queued == 0

    with pytest.raises(SlotControllerClosed):
        controller.slot("e4")
    with pytest.raises(SlotControllerClosed):
        async with controller.slot("e5"):
            pytest.fail("no admission after shutdown")

    drained = asyncio.create_task(controller.drained())
    await settle()
    assert not drained.done()
    assert not active.running.done()  # running work keeps its own lifecycle
    assert controller.active == 1

    await finish(active)
    await drained
    assert controller.active == 0
    assert controller.evidence("e1").succeeded == 1
    assert controller.evidence("e2") == SlotEvidence(
        failed=1, queue_ns=controller.evidence("e2").queue_ns
    )
    assert controller.evidence("e4").failed == 1
    controller.shutdown()  # idempotent


async def test_slot_created_before_shutdown_is_refused_on_entry() -> None:
    controller = StepSlotController()
    slot = controller.slot("e1")
    controller.shutdown()
    with pytest.raises(SlotControllerClosed):
        async with slot:
            pytest.fail("no admission after shutdown")
    assert controller.evidence("e1").failed == 1
    await controller.wait_idle()  # nothing active: returns at once


# -- evidence ----------------------------------------------------------------------------


async def test_evidence_counts_and_timing_sums_cover_every_outcome() -> None:
    clock = FakeClock()
    admits: list[tuple[str, float]] = []
    releases: list[tuple[str, Outcome, float]] = []
    controller = StepSlotController(
        1,
        clock=clock,
        on_admit=lambda e, w: admits.append((e, w)),
        on_release=lambda e, o, x: releases.append((e, o, x)),
    )
    a, b = await start_in_order([Step(controller, "e1", "a"), Step(controller, "e1", "b")])

    clock.now = 10  # a succeeds after 10 ns; b is admitted after waiting 10 ns
    await finish(a)
    await until(lambda: b.entered.is_set())

    c = (await start_in_order([Step(controller, "e1", "c")]))[0]  # queued at 10
    clock.now = 13
    c.running.cancel()  # cancelled after waiting 3 ns
    await asyncio.gather(c.running, return_exceptions=True)

    clock.now = 20
    b.error = ValueError("boom")  # b fails after running 10 ns
    await finish(b)

    d = (await start_in_order([Step(controller, "e1", "d")]))[0]  # admitted at 20
    clock.now = 25
    d.running.cancel()  # cancelled while running, after 5 ns
    await asyncio.gather(d.running, return_exceptions=True)

    controller.shutdown()
    with pytest.raises(SlotControllerClosed):
        controller.slot("e1")  # refused admission counts as failed

    evidence = controller.evidence("e1")
    assert evidence == SlotEvidence(
        version=1, admitted=3, succeeded=1, failed=2, cancelled=2, queue_ns=13, execution_ns=25
    )
    attempts = 5
    assert evidence.succeeded + evidence.failed + evidence.cancelled == attempts
    assert json.loads(evidence.to_json()) == {
        "version": 1,
        "admitted": 3,
        "succeeded": 1,
        "failed": 2,
        "cancelled": 2,
        "queue_ns": 13,
        "execution_ns": 25,
    }
    assert admits == [("e1", 0.0), ("e1", 10e-9), ("e1", 0.0)]
    assert releases == [
        ("e1", "succeeded", 10e-9),
        ("e1", "failed", 10e-9),
        ("e1", "cancelled", 5e-9),
    ]


async def test_evidence_is_kept_per_execution_and_removed_by_pop() -> None:
    controller = StepSlotController(2)
    for execution_id, count in (("e1", 3), ("e2", 1)):
        for _ in range(count):
            async with controller.slot(execution_id):
                pass

    assert controller.evidence("e1").admitted == 3
    assert controller.evidence("e2").admitted == 1
    snapshot = controller.evidence("e1")
    snapshot.admitted = 99  # a copy: the controller's record is unaffected
    assert controller.evidence("e1").admitted == 3

    popped = controller.pop_evidence("e1")
    assert (popped.admitted, popped.succeeded) == (3, 3)
    assert controller.evidence("e1") == SlotEvidence()
    assert controller.pop_evidence("e1") == SlotEvidence()
    assert controller.evidence("e2").admitted == 1
    assert SlotEvidence().version == 1


def test_evidence_dict_names_every_field_with_its_value() -> None:
    """``to_dict`` is written by hand (no deep copy): it must still carry every field,
    so a field added later and forgotten there fails here."""
    names = [f.name for f in dataclasses.fields(SlotEvidence)]
    evidence = SlotEvidence(**{name: i + 2 for i, name in enumerate(names)})
    assert evidence.to_dict() == {name: i + 2 for i, name in enumerate(names)}
    assert json.loads(evidence.to_json()) == evidence.to_dict()


# -- results and shared capacity ---------------------------------------------------------


@pytest.mark.parametrize(
    "limit",
    [
        pytest.param(1, id="sequential"),
        pytest.param(3, id="parallel"),
        pytest.param(0, id="unrestricted"),
    ],
)
async def test_limit_does_not_change_handler_results(limit: int) -> None:
    controller = StepSlotController(limit)
    stored: dict[str, int] = {}

    async def handler(execution_id: str, cell: int) -> None:
        async with controller.slot(execution_id):
            for _ in range(cell % 3):
                await asyncio.sleep(0)
            stored[f"{execution_id}/{cell}"] = cell * cell

    await asyncio.gather(*(handler(f"e{i % 2}", i) for i in range(20)))
    assert stored == {f"e{i % 2}/{i}": i * i for i in range(20)}


async def test_two_executions_share_a_limit_of_two() -> None:
    log: list[str] = []
    peak = 0

    def track(execution_id: str, wait_s: float) -> None:
        nonlocal peak
        peak = max(peak, controller.active)

    controller = StepSlotController(2, on_admit=track)
    first = [Step(controller, "obs-1", f"1.{i}", log) for i in range(4)]
    second = [Step(controller, "obs-2", f"2.{i}", log) for i in range(4)]
    await start_in_order([*first, *second])
    assert (controller.active, controller.queued) == (2, 6)

    for step in [*first, *second]:
        await finish(step)
        await settle()
        assert controller.active <= 2
    assert log == [s.name for s in [*first, *second]]
    assert peak == 2
    assert controller.evidence("obs-1").admitted == 4
    assert controller.evidence("obs-2").admitted == 4


async def test_sequential_partitions_of_one_execution_compete_with_other_executions() -> None:
    controller = StepSlotController(1)
    log: list[str] = []
    gates = {name: asyncio.Event() for name in ("p1", "p2", "p3", "other")}
    started = {name: asyncio.Event() for name in gates}

    async def partition(execution_id: str, name: str) -> None:
        async with controller.slot(execution_id):
            log.append(name)
            started[name].set()
            await gates[name].wait()

    async def sequential_execution() -> None:
        for name in ("p1", "p2", "p3"):
            await partition("e1", name)  # one partition at a time within the execution

    sequential = asyncio.create_task(sequential_execution())
    await started["p1"].wait()
    other = asyncio.create_task(partition("e2", "other"))  # queued before p2 arrives
    await settle()
    gates["p1"].set()
    await started["other"].wait()
    assert controller.queued == 1  # p2 waits behind the other execution's task
    for name in ("other", "p2", "p3"):
        gates[name].set()
    await asyncio.gather(sequential, other)
    assert log == ["p1", "other", "p2", "p3"]


async def test_orchestration_outside_slots_can_run_dependencies_with_a_limit_of_one() -> None:
    controller = StepSlotController(1)

    async def dependency(value: int) -> int:
        async with controller.slot("e1"):
            await asyncio.sleep(0)
            return value * 10

    async def orchestrator() -> int:  # does not hold a slot itself
        results = await asyncio.gather(dependency(1), dependency(2), dependency(3))
        return sum(results)

    assert await orchestrator() == 60
    assert controller.evidence("e1").admitted == 3


async def test_nested_slot_acquisition_is_not_reentrant() -> None:
    # Documented limitation: a handler holding the only slot waits for nested slotted work.
    controller = StepSlotController(1)
    inner_ran = False

    async def outer() -> None:
        nonlocal inner_ran
        async with controller.slot("e1"), controller.slot("e1"):
            inner_ran = True

    task = asyncio.create_task(outer())
    await settle()
    assert (controller.active, controller.queued, inner_ran) == (1, 1, False)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (controller.active, controller.queued) == (0, 0)


async def test_many_contenders_never_exceed_the_limit_and_all_complete() -> None:
    limit = 7
    controller = StepSlotController(limit)
    current = peak = 0
    completed: list[int] = []

    async def contender(index: int) -> None:
        nonlocal current, peak
        async with controller.slot(f"e{index % 5}"):
            current += 1
            peak = max(peak, current)
            assert controller.active <= limit
            for _ in range(index % 4 + 1):
                await asyncio.sleep(0)
            current -= 1
        completed.append(index)

    await asyncio.gather(*(contender(i) for i in range(200)))
    assert peak == limit
    assert sorted(completed) == list(range(200))
    assert (controller.active, controller.queued) == (0, 0)
    assert sum(controller.evidence(f"e{i}").succeeded for i in range(5)) == 200


# -- random interleavings ----------------------------------------------------------------

_EXECUTIONS = ("e1", "e2", "e3")
_OPERATION = st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, len(_EXECUTIONS) - 1), st.booleans()),
    st.tuples(st.just("finish"), st.integers(0, 63), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 63), st.booleans()),
    st.tuples(st.just("set_limit"), st.integers(0, 4), st.booleans()),
)


async def _interleave(initial_limit: int, operations: list[tuple[str, int, bool]]) -> None:
    admitted_order: list[int] = []
    violations: list[str] = []
    controller: StepSlotController | None = None

    def on_admit(task_id: str, wait_s: float) -> None:
        assert controller is not None
        limit, active = controller.limit, controller.active
        if limit and active > limit:
            violations.append(f"admitted {task_id} with active={active} > limit={limit}")
        admitted_order.append(int(task_id))

    controller = StepSlotController(initial_limit, on_admit=on_admit)
    steps: list[Step] = []
    released: set[int] = set()

    for kind, arg, settle_after in operations:
        if kind == "arrive":
            # Unique ids per task so FIFO order and evidence can be checked per task.
            name = f"{_EXECUTIONS[arg]}#{len(steps)}"
            steps.append(Step(controller, str(len(steps)), name).start())
        elif kind == "finish":
            running = [i for i, s in enumerate(steps) if s.entered.is_set() and i not in released]
            if running:
                index = running[arg % len(running)]
                released.add(index)
                steps[index].release.set()
        elif kind == "cancel":
            alive = [s for s in steps if not s.running.done()]
            if alive:
                alive[arg % len(alive)].running.cancel()
        else:
            controller.set_limit(arg)
        if settle_after:
            await settle()
            # Work-conserving: nothing waits while there is free capacity.
            limit = controller.limit
            assert controller.queued == 0 or (limit > 0 and controller.active >= limit)
            holding = [s for s in steps if s.entered.is_set() and not s.running.done()]
            assert controller.active == len(holding)

    await settle()
    assert not violations, violations
    # FIFO: grants happen in strictly increasing arrival order.
    assert admitted_order == sorted(admitted_order)
    assert len(set(admitted_order)) == len(admitted_order)

    controller.set_limit(0)
    for step in steps:
        step.release.set()
    outcomes = await asyncio.gather(*(s.running for s in steps), return_exceptions=True)
    assert (controller.active, controller.queued) == (0, 0)
    for index, (step, outcome) in enumerate(zip(steps, outcomes, strict=True)):
        evidence = controller.evidence(str(index))
        if not step.arrived:  # cancelled before it ever reached the controller
            assert evidence == SlotEvidence()
            continue
        assert evidence.succeeded + evidence.failed + evidence.cancelled == 1
        if isinstance(outcome, asyncio.CancelledError):
            assert evidence.cancelled == 1
        else:
            assert outcome is None and step.entered.is_set() and evidence.succeeded == 1
        assert evidence.admitted == (1 if index in set(admitted_order) else 0)
        assert evidence.admitted >= int(step.entered.is_set())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial_limit=st.integers(0, 3), operations=st.lists(_OPERATION, max_size=60))
def test_random_interleavings_keep_the_limit_and_fifo_order(
    initial_limit: int, operations: list[tuple[str, int, bool]]
) -> None:
    asyncio.run(_interleave(initial_limit, operations))
