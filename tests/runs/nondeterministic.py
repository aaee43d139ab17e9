"""A ``python`` handler whose output differs on every call: a replay of a run using it
must be reported as different (``airt runs replay --compare`` exits 1). Allowed in the
CLI tests through ``AIRUNTIME_PYTHON_HANDLER_MODULES=tests.runs.nondeterministic``."""

from __future__ import annotations

import uuid


def fresh_token() -> str:
    return uuid.uuid4().hex
