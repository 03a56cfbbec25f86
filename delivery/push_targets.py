"""Where push delivery may send: public addresses, and the networks an operator allows.

A push subscription makes the gateway POST to a URL a client chose.  Without a check, a client
could make it talk to loopback services, the private network, or a cloud's metadata service
(server-side request forgery).  So by default only *public* addresses are allowed; loopback,
private (RFC 1918, unique-local, carrier-grade NAT), link-local (where the metadata services
live: 169.254.169.254, fd00:ec2::254), multicast, reserved and unspecified addresses are refused
unless one of the operator's ``push_allow`` networks contains them.  An IPv4 address inside
IPv6 (``::ffff:a.b.c.d``, NAT64 ``64:ff9b::a.b.c.d``, 6to4 ``2002:aabb:ccdd::``, and Teredo's
server and client ``2001:0:...``) is judged as the IPv4 address it reaches, a 6to4 or Teredo
one as itself too: every one of them must be allowed.

The check is made on the address that is actually connected to: :class:`GuardedBackend` is
the only way push delivery opens a connection; it resolves the host once, keeps the allowed
addresses, and connects to one of those addresses itself, so no later DNS answer can swap in
another address (no DNS-rebinding window).  The URL's host name still goes in the ``Host``
header and in TLS's SNI and certificate check.  Redirects are never followed, and no proxy
from the environment is used.  A refused target is a connection error of that delivery: the
subscription's ``last_error`` says why and nothing is sent.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpcore
import httpx

from log_store.errors import BadRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_log = logging.getLogger(__name__)


class TargetRefused(BadRequest):
    """A push endpoint whose address is not allowed (or cannot be resolved)."""


def _reached(address: IPAddress) -> tuple[IPAddress, ...]:
    """The addresses to judge a connection to ``address`` by: the IPv4 address inside a
    mapped or NAT64 one; a 6to4 one and its IPv4 address; a Teredo one, its server's and its
    client's; else ``address`` itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return (address.ipv4_mapped,)
        if address in _NAT64:
            return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
        if address.sixtofour is not None:
            return (address, address.sixtofour)
        if address.teredo is not None:
            return (address, *address.teredo)
    return (address,)


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is an ordinary Internet address (none of the refused kinds), and
    so is every IPv4 address it embeds."""
    return all(_is_public(reached) for reached in _reached(address))


def _is_public(address: IPAddress) -> bool:
    return address.is_global and not (
        address.is_multicast
        or address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_reserved
        or address.is_unspecified
    )


@dataclass(frozen=True)
class PushTargetPolicy:
    """Public addresses, plus the ``allow`` networks."""

    allow: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_config(cls, networks: Iterable[str]) -> PushTargetPolicy:
        return cls(tuple(ipaddress.ip_network(n, strict=False) for n in networks))

    def allows(self, address: IPAddress) -> bool:
        if any(address in net for net in self.allow):
            return True
        return all(
            any(reached in net for net in self.allow) or _is_public(reached)
            for reached in _reached(address)
        )

    async def resolve(self, host: str, port: int) -> list[str]:
        """The allowed addresses of ``host``; :class:`TargetRefused` if there is none."""
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
            found = [literal]
        except ValueError:
            try:
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise TargetRefused(
                    f"push endpoint host {host!r} does not resolve: {exc}"
                ) from None
            found = []
            for info in infos:
                text = str(info[4][0]).split("%", 1)[0]
                address = ipaddress.ip_address(text)
                if address not in found:
                    found.append(address)
        allowed = [str(a) for a in found if self.allows(a)]
        if not allowed:
            # The addresses go to the operator's log only: a client that learnt the gateway's
            # DNS answers could map the internal network's names to addresses.
            _log.warning(
                "push endpoint host %r refused: it resolves to %s, none of them public or in "
                "push_allow",
                host,
                ", ".join(str(a) for a in found),
            )
            raise TargetRefused(
                f"push endpoint host {host!r} is not a public address and not in the "
                "gateway's push_allow networks"
            )
        return allowed

    async def check_url(self, url: str) -> None:
        """Refuse a subscription whose endpoint could never be delivered to."""
        parts = urlsplit(url)
        if parts.hostname is None:
            raise TargetRefused(f"push endpoint {url!r} has no host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise TargetRefused(f"push endpoint {url!r} has an invalid port") from None
        await self.resolve(parts.hostname, port)


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Opens TCP connections only to addresses the policy allows, chosen here, once."""

    def __init__(self, policy: PushTargetPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self._policy.resolve(host, port)
        except TargetRefused as exc:
            raise httpcore.ConnectError(str(exc)) from None
        failure: Exception | None = None
        for address in addresses:
            try:
                stream = await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
                continue
            _check_peer(stream, self._policy, host)
            return stream
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("push delivery does not connect to Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _check_peer(stream: httpcore.AsyncNetworkStream, policy: PushTargetPolicy, host: str) -> None:
    """The connected peer is an allowed address (what the kernel connected to, not a name)."""
    peer: Sequence[Any] | None = stream.get_extra_info("server_addr")
    if not peer:
        raise httpcore.ConnectError(f"push endpoint {host!r}: the connected address is unknown")
    address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    if not policy.allows(address):
        raise httpcore.ConnectError(f"push endpoint {host!r} connected to refused {address}")


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool that connects through :class:`GuardedBackend`."""

    def __init__(self, policy: PushTargetPolicy, *, max_connections: int = 4) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl.create_default_context(),
            max_connections=max_connections,
            network_backend=GuardedBackend(policy),
        )


def guarded_client(policy: PushTargetPolicy, timeout_s: float) -> httpx.AsyncClient:
    """The HTTP client of one push subscription: guarded connections, no redirects, no proxy.

    ``timeout_s`` bounds each connect, write and read, and the wait for a pooled connection;
    push delivery also gives each POST as a whole that deadline (``PushSubscription.timeout_ms``),
    so an endpoint that keeps sending a little at a time cannot hold it longer."""
    return httpx.AsyncClient(
        transport=GuardedTransport(policy),
        timeout=httpx.Timeout(timeout_s),
        follow_redirects=False,
        trust_env=False,
    )
