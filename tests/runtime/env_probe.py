"""What a pipeline step sees of its runtime's environment (``uses: python`` target).

A plain (sync) function: the python handler runs it in the runtime's handler thread
pool, the way a tenant's sync code runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def read_environment() -> dict[str, Any]:
    """Everything a step could read to find the runtime's credentials."""
    child = subprocess.run(
        [sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    proc = Path("/proc/self/environ")
    return {
        "os_environ": dict(os.environ),
        "child_environ": child.stdout,
        "proc_environ": proc.read_bytes().decode(errors="replace") if proc.exists() else "",
    }
