"""The control plane archives whole runs and forgets them only afterwards.

A real control plane (background pump, archivers, retention with a one-second window)
and an in-process runtime on real Valkey/Redis, with a SQLite history file: every
submitted run's execution is archived with its RunId, SharedRunId and step-slot
evidence, its shared run too; then retention removes the hot keys -- and a shared run
is kept in Redis as long as the history does not have it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.core import keys
from airuntime.history import open_history_store
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import LOCAL_RUNTIME, TINY_PIPELINE, serving, snap, wait_for
from tests.history.conftest import settings

pytestmark = pytest.mark.timeout(120)

RUNS = 4


async def test_runs_are_archived_then_their_hot_keys_go(redis: Redis, tmp_path: Path) -> None:
    history = await open_history_store(f"sqlite:///{tmp_path / 'history.db'}", settings=settings())
    cp = ControlPlane(
        redis,
        ControlPlaneSettings(scale_out_enabled=False, retention_s=1, retention_interval_s=0.2),
        history=history,
    )
    assert cp.archiver is not None
    cp.archiver.idle_s = 0.05
    host = RuntimeHost(redis, LOCAL_RUNTIME.model_copy(update={"run_retention_s": 1}))
    try:
        async with serving(cp, host):
            ids = [(await cp.submit(TINY_PIPELINE, snap())).shared_run_id for _ in range(RUNS)]

            async def executions_archived() -> list[str] | None:
                runs = await cp.runs.get_many(ids)
                eids = [r.execution_id for r in runs if r.execution_id and r.status.terminal]
                if len(eids) < RUNS:
                    return None
                found = [await history.get_execution(e, "default") for e in eids]
                return eids if all(found) else None

            eids = await wait_for(executions_archived, what="every execution archived")
            assert eids is not None
            for eid in eids:
                archived = await history.get_execution(eid, "default")
                assert archived is not None
                assert archived.run_id and archived.shared_run_id in ids
                assert archived.step_slots is not None, "the runtime's evidence is kept"
                assert archived.status == "Succeeded"

            async def shared_runs_archived() -> bool:
                return all([await history.get_shared_run(i, "default") for i in ids])

            await wait_for(shared_runs_archived, what="every shared run archived")

            async def hot_keys_gone() -> bool:
                pipe = redis.pipeline()
                for i in ids:
                    pipe.exists(keys.shared_run(i), keys.squeue_item("default", i))
                for e in eids:
                    pipe.exists(*keys.execution_keys(e).all())
                    pipe.zscore(keys.executions_index(), e)
                return not any(await pipe.execute())

            await wait_for(hot_keys_gone, timeout_s=60, what="hot keys past retention")
            assert await redis.zcard(keys.archive_outbox()) == 0
            assert await redis.zcard(keys.shared_run_archive_outbox()) == 0
    finally:
        await history.close()


async def test_a_shared_run_the_history_lacks_stays_in_redis(redis: Redis, tmp_path: Path) -> None:
    history = await open_history_store(f"sqlite:///{tmp_path / 'history.db'}", settings=settings())
    cp = ControlPlane(
        redis,
        ControlPlaneSettings(scale_out_enabled=False, retention_s=1, retention_interval_s=3600),
        history=history,
    )
    run_archiver, cp.run_archiver, cp.archiver = cp.run_archiver, None, None  # test drives
    assert run_archiver is not None
    host = RuntimeHost(redis, LOCAL_RUNTIME)
    try:
        async with serving(cp, host):
            srid = (await cp.submit(TINY_PIPELINE, snap())).shared_run_id
            await cp.drain()

            async def finished() -> bool:
                run = await cp.runs.get(srid)
                return run is not None and run.status.terminal

            await wait_for(finished, what="the run to end")
            ended = time.monotonic()

            async def past_window() -> bool:
                return time.monotonic() - ended > 1.2

            await wait_for(past_window, what="the retention window to pass")
            report = await cp.retention.prune_once()
            assert report.kept == [srid], "not archived: kept"
            assert await redis.exists(keys.shared_run(srid))
            assert await run_archiver.archive_once() == 1
            report = await cp.retention.prune_once()
            assert report.shared_runs == 1
            assert not await redis.exists(keys.shared_run(srid))
            assert await history.get_shared_run(srid, "default") is not None
    finally:
        await history.close()
