"""Credentials leave a runtime process's environment once its settings are read.

Why this module exists: pipeline authors are untrusted tenants, and their steps run
inside the runtime process (async handlers on its loop, sync handlers in its threads,
subprocesses those start). The process needs the shared Redis URL (which may carry a
password) and the runtime token only to build its client and its API; a handler must
not find them in ``os.environ``, in a child's inherited environment, or in
``/proc/self/environ``. :func:`scrub_secrets` therefore removes the variables from
``os.environ`` (and the C environment, so children do not inherit them) and blanks
their values in the process's initial environment block, which is what
``/proc/<pid>/environ`` shows and which ``unsetenv`` leaves in place.

What it cannot do: code running in the process can still reach objects that hold the
credentials (the Redis client), and a secret passed as a command-line option stays in
``/proc/<pid>/cmdline`` -- pass secrets through the environment.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

from airuntime.core.settings import ENV_PREFIX, env_name
from airuntime.fleet.instance_settings import SECRET_SETTINGS

__all__ = ["SECRET_MARKERS", "scrub_secrets", "secret_variables"]

SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD")
"""An ``AIRUNTIME_*`` variable whose name contains one of these is a credential too
(``AIRUNTIME_API_TOKEN`` of the CLI, for one)."""


def secret_variables(environ: Iterable[str]) -> list[str]:
    """The credential-bearing variables among ``environ``'s names."""
    explicit = {env_name(field) for field in SECRET_SETTINGS}
    return sorted(
        name
        for name in environ
        if name in explicit
        or (name.startswith(ENV_PREFIX) and any(m in name for m in SECRET_MARKERS))
    )


def scrub_secrets() -> list[str]:
    """Remove every credential-bearing variable from this process; the names removed."""
    names = secret_variables(os.environ)
    for name in names:
        _blank_initial_value(name)
        del os.environ[name]  # also unsetenv(): children no longer inherit it
    return names


def _blank_initial_value(name: str) -> None:
    """Overwrite the value of ``name`` where the C environment points to it (for
    variables present at exec time: the block ``/proc/self/environ`` reads). Best
    effort: where ctypes cannot reach ``environ``, only ``os.environ`` is cleaned."""
    prefix = f"{name}=".encode()
    try:
        libc = ctypes.CDLL(None)
        entries = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    except (OSError, ValueError, AttributeError):
        return
    i = 0
    while (address := entries[i]) is not None:
        text = ctypes.string_at(address)
        if text.startswith(prefix):
            ctypes.memset(address + len(prefix), 0, len(text) - len(prefix))
        i += 1
