"""The HTTP servers' listening sockets: opened first, refused with the address, and
served like the ones uvicorn opens itself (TCP_NODELAY on every accepted connection:
with a socket of protocol 0, asyncio left it off and each answer waited ~40 ms on
Nagle and the client's delayed ACK -- the runtime intake's deliveries among them)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from airuntime.core.errors import ConfigError
from airuntime.core.listening import listen_socket


async def test_accepted_connections_have_tcp_nodelay() -> None:
    sock = listen_socket("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("socket")
        accepted.set_result(peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connection, sock=sock)
    async with server:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        assert await asyncio.wait_for(accepted, 10) == 1
        writer.close()


def test_a_port_in_use_is_refused_naming_the_address_and_the_option() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as refused:
            listen_socket("127.0.0.1", port, "--http-port").close()
    assert str(refused.value) == (
        f"cannot listen on 127.0.0.1:{port}: Address already in use "
        "(choose another --http-port; 0 = any free port)"
    )


def test_a_host_that_does_not_resolve_is_refused_without_a_port_hint() -> None:
    with pytest.raises(ConfigError) as refused:
        listen_socket("no.such.host.invalid", 0).close()
    assert str(refused.value).startswith("cannot listen on no.such.host.invalid:0: ")
    assert "--port" not in str(refused.value)
