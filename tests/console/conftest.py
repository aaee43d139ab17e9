"""Fixtures of the web console suite: a real control plane served over TCP (uvicorn in a
thread, real Valkey, a real runtime host, a SQLite durable history) with the background
pump off, so a test decides when queued runs are dispatched (``dispatch``: the API's
drain); and headless Chromium (Debian's ``chromium`` driven by Playwright, never a
downloaded browser), skipped with the reason when either is missing.

Screenshots go to ``artifacts/console/`` (git-ignored); the README's images are copies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airuntime.control_plane.settings import ControlPlaneSettings
from tests.polling import wait_until
from tests.runs.served import ServedControlPlane

CHROMIUM = os.environ.get("AIRUNTIME_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "console"


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer token-{name}"}


class Stack:
    """The served control plane and an API client for setting the scene."""

    def __init__(self, served: ServedControlPlane) -> None:
        self.served = served
        self.url = served.url
        self.api = httpx.Client(base_url=served.url, timeout=30)

    def submit(self, pipeline: dict[str, Any], who: str = "alice-a", **extra: Any) -> str:
        resp = self.api.post("/v1/runs", json={"pipeline": pipeline, **extra}, headers=bearer(who))
        assert resp.status_code == 202, resp.text
        srid: str = resp.json()["shared_run_id"]
        return srid

    def drain(self) -> None:
        resp = self.api.post("/v1/queue/drain", json={}, headers=bearer("alice-a"))
        assert resp.status_code == 200, resp.text

    def dispatch(self, *runs: tuple[str, str]) -> None:
        """Drain until each (run, owner) left the queue. One drain may dispatch fewer
        runs than are queued: admission holds a reservation on the instance until its
        next capacity publication (a deadline poll, not an ordering sleep)."""
        for srid, who in runs:
            wait_until(
                lambda: self._drained_unless(self.run(srid, who)["status"] != "QueuedGlobally"),  # noqa: B023
                within=30,
                what=f"{srid} to be dispatched",
            )

    def settle(self) -> None:
        """Drain until nothing is pending for either tenant."""
        for who in ("alice-a", "bob-b"):
            wait_until(
                lambda: self._drained_unless(
                    not self.api.get("/v1/queue", headers=bearer(who)).json()["pending"]  # noqa: B023
                ),
                within=30,
                what=f"{who}'s queue to empty",
            )

    def _drained_unless(self, done: bool) -> bool:
        """``done``; when not, drain once more (the next poll sees the effect)."""
        if not done:
            self.drain()
        return done

    def run(self, srid: str, who: str = "alice-a") -> dict[str, Any]:
        resp = self.api.get(f"/v1/runs/{srid}", headers=bearer(who))
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        return body


@pytest.fixture(scope="module")
def stack(valkey_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    dsn = f"sqlite:///{tmp_path_factory.mktemp('console') / 'history.db'}"
    served = ServedControlPlane(
        valkey_url, dsn, ControlPlaneSettings(scale_out_enabled=False, background_pump=False)
    )
    served.start()
    s = Stack(served)
    try:
        yield s
    finally:
        s.api.close()
        served.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
