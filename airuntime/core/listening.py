"""The listening sockets of airuntime's HTTP servers, opened before anything else starts.

Why this exists: uvicorn binds its port in the middle of its own start-up and answers a
port in use with ``sys.exit(3)``, which, raised in the task serving it, stops the event
loop with every other task still pending (a page of tracebacks, exit 3, after Redis
clients, loops and registrations had started). The control plane's API and a runtime
host's intake open their socket here first instead: a port in use is a
:class:`~airuntime.core.errors.ConfigError` naming the address, and nothing was
started; the server then serves that socket (:func:`serve_on`).
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Protocol

from airuntime.core.errors import ConfigError

__all__ = ["listen_socket", "serve_on"]


class _Server(Protocol):
    async def serve(self, sockets: list[socket.socket] | None = None) -> None: ...


def listen_socket(host: str, port: int, option: str = "--port") -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port); ``option`` is the
    one that chose the port, named in the refusal."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        # The protocol is named, not left 0: asyncio sets TCP_NODELAY only on accepted
        # sockets whose proto is IPPROTO_TCP, and without it every answer waited on
        # Nagle and the client's delayed ACK (~40 ms a request on loopback, against ~1).
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen()
        except BaseException:
            sock.close()
            raise
        return sock
    except OSError as exc:
        # create_server's own strerror repeats the address; the errno's text does not.
        code = exc.errno if not isinstance(exc, socket.gaierror) else None
        reason = os.strerror(code) if code else exc.strerror or str(exc)
        taken = exc.errno in (errno.EADDRINUSE, errno.EACCES)
        hint = f" (choose another {option}; 0 = any free port)" if taken else ""
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}{hint}") from None


async def serve_on(server: _Server, sock: socket.socket) -> None:
    """``server`` (uvicorn's) on ``sock``; a failed start is a :class:`ConfigError`
    raised where the task is awaited, not ``SystemExit`` out of the event loop."""
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:
        raise ConfigError(f"the HTTP server could not start (exit {exc.code})") from None
