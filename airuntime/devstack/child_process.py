"""Child processes that never outlive the Python process that started them.

Why a module of its own: the embedded Valkey must die with its parent, even on
``kill -9`` of the parent. On Linux the child arms ``PR_SET_PDEATHSIG=SIGKILL``; that
signal fires when the *thread* that forked the child exits, so children are always
forked from a thread that lives as long as the process (:data:`SPAWNER`).
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["LOOPBACK", "SPAWNER", "free_port", "make_preexec"]

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def make_preexec() -> Callable[[], None] | None:
    """preexec_fn arming PR_SET_PDEATHSIG=SIGKILL in the child (Linux only).

    Everything that may allocate or take locks (loading libc, resolving ``prctl``)
    happens here, in the parent, *before* fork; the child only makes the call.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    parent_pid = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        # The parent may have died between fork() and prctl(): then we were already
        # re-parented and the death signal will never come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sigkill)

    return preexec


_Job = tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]


class _Spawner:
    """Runs ``Popen`` on a thread that lives as long as the process.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the
    process.  Spawning from e.g. an ``asyncio.to_thread`` worker would tie the
    server's life to that pool thread (and asyncio shuts its default executor down
    at the end of ``asyncio.run``).  So calls from the main thread spawn directly,
    and calls from any other thread are forwarded to one daemon thread that is
    never joined.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Job] | None = None
        self._pid = 0

    def spawn(self, fn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        if threading.current_thread() is threading.main_thread():
            return fn()
        fut: Future[subprocess.Popen[bytes]] = Future()
        self._ensure_thread().put((fn, fut))
        return fut.result()

    def _ensure_thread(self) -> queue.SimpleQueue[_Job]:
        with self._lock:
            if self._queue is None or self._pid != os.getpid():  # new, or forked child
                self._queue = queue.SimpleQueue()
                self._pid = os.getpid()
                threading.Thread(
                    target=self._run,
                    args=(self._queue,),
                    name="airuntime-spawner",
                    daemon=True,
                ).start()
            return self._queue

    @staticmethod
    def _run(q: queue.SimpleQueue[_Job]) -> None:
        while True:
            fn, fut = q.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)


SPAWNER = _Spawner()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
