"""A gateway without tokens answers only requests addressed to one of its own names.

Such a gateway lets every request do everything, and is reached only from its own machine
(it listens on loopback unless ``allow_public_without_tokens``).  A web page of another
origin cannot read its answers, and cannot send it a JSON body without a CORS preflight
(refused), but DNS rebinding gets round both: the page's own name is made to resolve to
127.0.0.1, after which the browser takes the gateway for the page's origin.  The browser
still sends the page's name in ``Host``, and that name is not one of the gateway's; an IP
address can never be rebound.  So, without tokens, a request is answered only when its
``Host`` is

- an IP address (``127.0.0.1``, ``[::1]``, any other: no DNS answer is involved, so a
  gateway allowed to listen publicly without tokens is still reached by its addresses),
- ``localhost`` or a name under ``.localhost`` (browsers resolve them to loopback themselves),
- the gateway's ``host`` or the host of its ``advertised_url`` (how its peers call it),
- or in ``allowed_hosts`` (``"gw1.example"``, ``".example"`` for it and every name under it, ``"*"``
  for any name);

anything else is 421 ``misdirected_host``.  A request a browser sends from a page carries the
page's ``Origin``: one that is not a loopback address or one of the names above is 403
``cross_origin`` (``null`` too, the origin of a sandboxed or local file's page).  This also
stops a page's simple ``text/plain`` POST to the legacy ``/store``.  A request without
``Host`` (HTTP/1.0) or ``Origin`` (every client but a browser) passes.  With tokens configured
nothing is checked here: a page has no token to send.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from ingest_api.errors import error_response
from ingest_api.settings import GatewaySettings


class HostNames:
    """The names a request may address a gateway by, besides IP addresses and localhost."""

    def __init__(self, names: Iterable[str]) -> None:
        cleaned = {_normalized(n) for n in names if n}
        self.any = "*" in cleaned
        self._exact = frozenset(n for n in cleaned if not n.startswith("."))
        self._suffixes = tuple(n for n in cleaned if n.startswith("."))

    @classmethod
    def of(cls, settings: GatewaySettings) -> HostNames:
        names = [settings.host, *settings.allowed_hosts]
        if settings.advertised_url:
            names.append(urlsplit(settings.advertised_url).hostname or "")
        return cls(names)

    def allows(self, host: str) -> bool:
        """Whether ``Host`` may name ``host`` (without the port): any IP address (no DNS answer
        can be rebound to it) or a name of the gateway's."""
        return _address(host) is not None or self.names(host)

    def allows_origin(self, host: str) -> bool:
        """Whether a page served from ``host`` may call: loopback or a name of the gateway's
        (a page may be served from any public address, so an address alone proves nothing)."""
        address = _address(host)
        return (address is not None and address.is_loopback) or self.names(host)

    def names(self, host: str) -> bool:
        name = _normalized(host)
        if self.any or name == "localhost" or name.endswith(".localhost"):
            return True
        return name in self._exact or any(
            name.endswith(suffix) or name == suffix[1:] for suffix in self._suffixes
        )


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(_normalized(host).strip("[]"))
    except ValueError:
        return None


def _normalized(name: str) -> str:
    return name.strip().lower().rstrip(".")


def _host_of_header(value: str) -> str:
    """``Host`` without its port: ``gw:8080`` -> ``gw``, ``[::1]:8080`` -> ``[::1]``."""
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _origin_host(origin: str) -> str:
    """The host of an ``Origin`` (``"null"`` from a sandboxed or file page: no host)."""
    try:
        return urlsplit(origin).hostname or ""
    except ValueError:
        return ""


class HostCheck:
    """Pure ASGI middleware refusing requests addressed to a name that is not the gateway's."""

    def __init__(self, app: ASGIApp, names: HostNames) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.names.any:
            await self.app(scope, receive, send)
            return
        host = origin = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        refusal = None
        if host is not None and not self.names.allows(_host_of_header(host)):
            refusal = error_response(
                421,
                "misdirected_host",
                f"Host {host[:100]!r} is not a name of this gateway: without tokens it answers "
                "only IP addresses, localhost, its host, its advertised_url's host and the "
                "names in allowed_hosts (add the name there if clients use it)",
            )
        elif origin is not None and not self.names.allows_origin(_origin_host(origin)):
            refusal = error_response(
                403,
                "cross_origin",
                f"a request from the web page of {origin[:100]!r}: without tokens this gateway "
                "answers pages of its own names only (IP addresses, localhost, its host, its "
                "advertised_url's host and allowed_hosts)",
            )
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
