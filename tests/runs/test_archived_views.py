"""The control plane's own archiver and retention move a run to the history, and every
view of it answers the same JSON afterwards (SQLite and PostgreSQL).

``test_reads`` proves the reader against a reference capture of the archive contract;
this test closes the loop with the real write side: the archivers (``archiver``,
``shared-run-archiver``) write what Redis held, retention (a one-second window) removes
the hot keys once the history has them, and details, ledger pages, trace, report and
the listing read from the archive are identical to what they were while hot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.core import keys
from airuntime.history import HistoryStore
from runtime_pod.config import InstanceConfig
from tests.control_plane.support import wait_for
from tests.runs.conftest import Api, serving_api
from tests.runs.support import FAN, ended, submit
from tests.runs.test_reads import _views

pytestmark = pytest.mark.timeout(180)

RUNS = 3


@pytest_asyncio.fixture
async def archiving_api(hot: Redis, store: HistoryStore) -> AsyncIterator[Api]:
    """The ``api`` fixture's stack, with the control plane archiving to ``store`` and a
    one-second retention window everywhere."""
    config = InstanceConfig(workers=4, heartbeat_s=0.5, assist=False, run_retention_s=1)
    settings = ControlPlaneSettings(
        scale_out_enabled=False, retention_s=1, retention_interval_s=0.2
    )
    async with serving_api(hot, store, config, settings, archive=True) as served:
        assert served.cp.archiver is not None
        yield served


async def _hot_keys(redis: Redis, srid: str, execution_id: str) -> list[str]:
    """The run's keys Redis still holds (shared run, queue item, execution keys)."""
    names = [
        keys.shared_run(srid),
        keys.squeue_item("tenant-a", srid),
        *keys.execution_keys(execution_id).all(),
    ]
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.exists(name)
    return [n for n, present in zip(names, await pipe.execute(), strict=True) if present]


async def test_runs_the_archiver_moved_read_the_same_as_while_hot(archiving_api: Api) -> None:
    api = archiving_api
    srids = [await submit(api.client, FAN) for _ in range(RUNS)]
    details = {srid: await ended(api.client, srid) for srid in srids}
    assert {d["status"] for d in details.values()} == {"Succeeded"}
    before: dict[str, dict[str, Any]] = {}
    for srid in srids:
        before[srid] = await _views(api.client, srid)
        before[srid].pop("list")  # the listing pages over every run; compared below
    listing = (
        await api.client.get("/v1/runs", headers={"authorization": "Bearer token-alice-a"})
    ).json()

    async def all_moved() -> bool:
        for srid, d in details.items():
            if await _hot_keys(api.redis, srid, d["execution_id"]):
                return False
        return True

    await wait_for(all_moved, timeout_s=90, what="archive, then retention of every run")
    for srid, d in details.items():
        archived = await api.history.get_execution(d["execution_id"], "tenant-a")
        assert archived is not None and archived.shared_run_id == srid
        assert await api.history.get_shared_run(srid, "tenant-a") is not None
        after = await _views(api.client, srid)
        after.pop("list")
        for view, body in before[srid].items():
            assert after[view] == body, f"{srid}: {view or 'details'} differs after retention"
    again = (
        await api.client.get("/v1/runs", headers={"authorization": "Bearer token-alice-a"})
    ).json()
    assert again == listing
    assert sorted(r["shared_run_id"] for r in listing["runs"]) == sorted(srids)
    assert await api.redis.zcard(keys.archive_outbox()) == 0
