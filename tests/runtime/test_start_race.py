"""The controller never starts a run with zero workers.

Found by the chaos test (tests/chaos): the controller checks for a free worker, then
reads the head of its queue from Redis; meanwhile the instance's assistance (or
adoption) took the last free workers, and the run was started with 0 workers -- the
pool refused (``workers must be >= 1``) and the run ended Failed. Now the run stays
queued and starts once a worker is free.
"""

from __future__ import annotations

from typing import Any

from runtime_pod.instance import RuntimeInstance
from tests.runtime.conftest import Runtime
from tests.runtime.support import pipeline, request


def workers_taken_while_the_queue_is_read(inst: RuntimeInstance, queued: str, other: str) -> None:
    """When the controller loads ``queued``, first lend every free worker to ``other``
    (what the assistance loop does), as if it had run during that read."""
    original = inst.index.get_unchecked
    done = False

    async def get_unchecked(run_id: str) -> Any:
        nonlocal done
        if run_id == queued and not done:
            done = True
            loaded = await original(other)
            assert loaded is not None
            assert inst.launch(*loaded, assisting=True), "the assistance took the workers"
            assert inst.available_workers == 0
        return await original(run_id)

    inst.index.get_unchecked = get_unchecked  # type: ignore[method-assign]


async def test_a_run_whose_workers_were_taken_meanwhile_waits_and_then_succeeds(
    runtime: Runtime,
) -> None:
    owner = await runtime.start("race-owner", workers=1, max_local_workers_per_execution=1)
    other = await owner.accept(request(pipeline(3)))
    await runtime.gate.wait_entered(1, "the other run executes on its owner")
    inst = runtime.instance("race-1", workers=2, max_local_workers_per_execution=2)
    queued = await inst.accept(request(pipeline(1)))
    workers_taken_while_the_queue_is_read(inst, queued, other)
    await inst.start()
    await runtime.gate.wait_entered(2, "the assisting workers joined the other run")
    runtime.gate.open()
    assert await runtime.watcher.reached(queued, "completed", "failed") == "completed"
    assert await runtime.watcher.reached(other, "completed", "failed") == "completed"
