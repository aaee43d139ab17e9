"""Where ``http`` steps may connect: never to the platform's own network unless allowed.

Why this module exists: a runtime pod sits next to the platform's Redis, the cloud
metadata service (``169.254.169.254`` hands out credentials) and every cluster-internal
service; a tenant's ``http`` step pointing there would use the pod's network position
against the platform (SSRF). Checking the URL's host before the request is not enough:
a name can resolve to a public address when checked and to ``127.0.0.1`` when connected
(DNS rebinding), and a public server can redirect to an internal one. So the check sits
where the connection is made, as an httpcore network backend (:class:`GuardedBackend`):
it resolves the host itself, refuses the connection if *any* address of the answer is
denied, and connects to the vetted address (never re-resolving). Every redirect hop and
every new connection goes through it. TLS still verifies the URL's host name (httpcore
passes it as SNI and for certificate checks). Environment proxies are ignored
(``trust_env=False``): a proxy would connect on the step's behalf, unchecked.

Denied (:func:`classify` names the class in the refusal): loopback, link-local
(including the cloud metadata addresses, named as such), private RFC 1918, shared
address space 100.64.0.0/10 (CGNAT), unique-local IPv6, unspecified, multicast, any
other address that is not globally routable (reserved, documentation, benchmarking),
IPv4 addresses embedded in IPv6 (mapped, NAT64, 6to4) by their IPv4 class, and the
networks of ``AIRUNTIME_HTTP_HANDLER_DENY_CIDRS``. ``AIRUNTIME_HTTP_HANDLER_ALLOW`` lists
networks and host names that may be reached anyway (see
:mod:`~airuntime.engine.handlers.settings`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpcore
import httpx

from airuntime.engine.handlers import StepFailed
from airuntime.engine.handlers.settings import HandlerSettings, IPNetwork

__all__ = [
    "METADATA_ADDRESSES",
    "AddressClass",
    "EgressPolicy",
    "EgressRefused",
    "GuardedBackend",
    "GuardedTransport",
    "classify",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""(host, port) -> the addresses to connect to, in order."""


class AddressClass(StrEnum):
    """Why an address is denied (the text reads "a <class> address")."""

    METADATA = "cloud metadata"
    LOOPBACK = "loopback"
    LINK_LOCAL = "link-local"
    PRIVATE = "private (RFC 1918)"
    SHARED = "shared (CGNAT, 100.64.0.0/10)"
    UNIQUE_LOCAL = "unique-local IPv6"
    UNSPECIFIED = "unspecified"
    MULTICAST = "multicast"
    NOT_GLOBAL = "reserved, not globally routable"
    CONFIGURED = "denied by AIRUNTIME_HTTP_HANDLER_DENY_CIDRS"


#: Instance metadata endpoints of the usual clouds (AWS, GCP, Azure, OpenStack: the
#: IPv4 one; AWS ECS task metadata; AWS IPv6; Alibaba Cloud; Oracle Cloud).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)

_V4_CLASSES: tuple[tuple[IPNetwork, AddressClass], ...] = tuple(
    (ipaddress.ip_network(net), cls)
    for net, cls in (
        ("0.0.0.0/8", AddressClass.UNSPECIFIED),
        ("127.0.0.0/8", AddressClass.LOOPBACK),
        ("169.254.0.0/16", AddressClass.LINK_LOCAL),
        ("10.0.0.0/8", AddressClass.PRIVATE),
        ("172.16.0.0/12", AddressClass.PRIVATE),
        ("192.168.0.0/16", AddressClass.PRIVATE),
        ("100.64.0.0/10", AddressClass.SHARED),
        ("224.0.0.0/4", AddressClass.MULTICAST),
    )
)
_V6_CLASSES: tuple[tuple[IPNetwork, AddressClass], ...] = tuple(
    (ipaddress.ip_network(net), cls)
    for net, cls in (
        ("::/128", AddressClass.UNSPECIFIED),
        ("::1/128", AddressClass.LOOPBACK),
        ("fe80::/10", AddressClass.LINK_LOCAL),
        ("fc00::/7", AddressClass.UNIQUE_LOCAL),
        ("ff00::/8", AddressClass.MULTICAST),
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, 6to4), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def classify(
    ip: IPAddress,
    denied: Iterable[IPNetwork] = (),
    allowed: Iterable[IPNetwork] = (),
) -> AddressClass | None:
    """Why ``ip`` may not be reached, or None if it may (``allowed`` wins over everything)."""
    if any(ip in net for net in allowed if net.version == ip.version):
        return None
    if ip in METADATA_ADDRESSES:
        return AddressClass.METADATA
    if any(ip in net for net in denied if net.version == ip.version):
        return AddressClass.CONFIGURED
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_v4(ip)
        if embedded is not None:
            return classify(embedded, denied, allowed)
        table = _V6_CLASSES
    else:
        table = _V4_CLASSES
    for net, cls in table:
        if ip in net:
            return cls
    return None if ip.is_global else AddressClass.NOT_GLOBAL


class EgressRefused(StepFailed):
    """An ``http`` step tried to reach an address it may not (never retried)."""


async def _resolve(host: str, port: int) -> Sequence[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[str, None] = {}
    for *_, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]), None)
    return list(seen)


@dataclass(frozen=True)
class EgressPolicy:
    """The denied and allowed networks and host names, from :class:`HandlerSettings`."""

    denied: tuple[IPNetwork, ...] = ()
    allowed: tuple[IPNetwork, ...] = ()
    allowed_hosts: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: HandlerSettings) -> EgressPolicy:
        return cls(
            settings.http_handler_deny_cidrs,
            settings.allowed_networks(),
            settings.allowed_hosts(),
        )

    def refusal(self, host: str, addresses: Sequence[str]) -> str | None:
        """Why connecting to ``host`` at ``addresses`` is refused, or None."""
        if host.lower().rstrip(".") in self.allowed_hosts:
            return None
        if not addresses:
            return f"host {host!r} resolves to no address"
        for text in addresses:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
            cls = classify(ip, self.denied, self.allowed)
            if cls is not None:
                shown = "is" if text == host else f"resolves to {text}, which is"
                return (
                    f"host {host!r} {shown} a {cls} address; http steps may not reach it "
                    "(the platform can allow it with AIRUNTIME_HTTP_HANDLER_ALLOW)"
                )
        return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects only to addresses the policy allows."""

    def __init__(self, policy: EgressPolicy, resolve: Resolver = _resolve) -> None:
        self.policy = policy
        self._resolve = resolve
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await asyncio.wait_for(self._resolve(host, port), timeout)
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
        problem = self.policy.refusal(host, addresses)
        if problem is not None:
            raise EgressRefused(problem)
        error: Exception | None = None
        for address in addresses:  # the vetted addresses themselves: no second lookup
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise EgressRefused(f"unix socket {path!r}: http steps may not reach local sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport (HTTP/1.1, TLS verified, no environment proxies) over a
    :class:`GuardedBackend`."""

    def __init__(self, policy: EgressPolicy, resolve: Resolver = _resolve) -> None:
        super().__init__(trust_env=False)
        limits = httpx.Limits()
        # httpx has no public way to choose the network backend: its pool is rebuilt
        # with the same options and ours (tests exercise it against real servers).
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(policy, resolve),
        )
