"""The README's first command: `airt demo` runs the whole local stack end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_demo_places_each_tenant_on_its_own_runtime_through_scale_out(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AIRUNTIME_REDIS_URL"}
    env["TMPDIR"] = str(tmp_path)  # where the demo makes its private home
    env["COLUMNS"] = "80"  # a newcomer's terminal: every line must still be whole
    result = subprocess.run(
        [sys.executable, "-m", "airuntime.cli", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        line.split("│")[1].strip(): line
        for line in result.stdout.splitlines()
        if line.count("│") > 4
    }
    assert "runtime-instance-1" in rows["default"]
    assert "tenant-a-runtime-1" in rows["tenant-a"]
    assert "tenant-b-runtime-1" in rows["tenant-b"]
    assert all("completed" in row for row in rows.values())
    assert "ScaleOutRequested" in result.stderr, "the demo shows scale-out happening"
    submits = [line for line in result.stderr.splitlines() if " -> sr-" in line]
    assert len(submits) == 3 and all(line.endswith(": ScaleOutRequested") for line in submits), (
        result.stderr
    )
    assert list(tmp_path.iterdir()) == [], "a demo that worked leaves nothing behind"
