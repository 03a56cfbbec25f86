"""One request of a command to an installation's gateways, waited out while they are unavailable.

``logbroker schemas``, ``topics --server`` and ``audit --windows --server`` ask a gateway one
thing and exit.  A gateway answers 503 for a while where waiting helps: on Kafka, a partition
whose owner died is ``partition_unavailable`` until the consumer group moves it (about ten
seconds); a store that is away, a gateway that is starting or stopping, say the same.  So a
request that finds every gateway of ``--server URL[,URL...]`` unreachable (connection refused
or reset) or answering 502, 503 or 504 is asked of the next gateway at once, and once all of
them failed, again after a pause (0.5 s growing to 5 s, or what ``Retry-After`` asks for, at
most 30 s), until ``--gateway-retry`` seconds (default 30) have passed: then
:class:`GatewayStillUnavailable`, which the commands turn into exit status
:data:`EXIT_UNAVAILABLE`.  Any other answer (a 4xx above all: the request is wrong, and asking
again gets the same answer) is returned at once.

A request asked again may have been carried out by an attempt whose answer was lost (a
connection reset after it was sent, a 503 of a gateway that forwarded it to an owner that
died answering); :attr:`GatewayClient.asked_again_after_sending` says so, for a command to
word its answer.  Every request these commands send is safe to repeat: a schema the log type
already has answers its version (``created`` false), a compatibility mode or a topic's
settings set twice are set once; creating a topic that an earlier attempt created is refused
409, and deleting one an earlier attempt deleted 404, which the command then words as such.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import httpx

from log_store.errors import LogbrokerError
from ops.commands.arg_types import seconds
from yt_loader.log_source import retry_after_s

DEFAULT_GATEWAY_RETRY_S = 30.0
EXIT_UNAVAILABLE = 4
"""The exit status of a command whose gateways stayed unavailable for ``--gateway-retry``."""
RETRIED_STATUSES = frozenset({502, 503, 504})
_FIRST_PAUSE_S = 0.5
_MAX_PAUSE_S = 5.0


class GatewayStillUnavailable(LogbrokerError):
    """Every gateway stayed unreachable or unavailable (502, 503, 504) for the whole bound."""


SERVERS_HELP = (
    "; several gateways of one installation (comma-separated): a request a gateway cannot "
    "answer goes to the next"
)
"""The end of a ``--server URL[,URL...]`` option's help."""


def add_gateway_retry(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """``--gateway-retry SECONDS``; ``suppress``: left out of the namespace unless given (an
    option accepted both before and after a command's action)."""
    parser.add_argument(
        "--gateway-retry",
        type=seconds,
        default=argparse.SUPPRESS if suppress else DEFAULT_GATEWAY_RETRY_S,
        metavar="SECONDS",
        help="with --server: how long a request is tried again while every gateway is "
        f"unreachable or answers 502, 503 or 504, before the command exits {EXIT_UNAVAILABLE} "
        f"(default {DEFAULT_GATEWAY_RETRY_S:g}; 0 gives up at once)",
    )


def gateway_retry_of(args: argparse.Namespace) -> float:
    """``--gateway-retry`` as parsed, its default where the option was left out after the
    action (``argparse.SUPPRESS``)."""
    value = getattr(args, "gateway_retry", None)
    return DEFAULT_GATEWAY_RETRY_S if value is None else float(value)


class GatewayClient:
    """Requests to the gateways of ``servers`` (``URL[,URL...]``), each waited out as the
    module says.  ``command`` names the command in the one line said on stderr when a request
    starts waiting."""

    def __init__(
        self,
        servers: str,
        *,
        command: str,
        token: str | None = None,
        retry_s: float = DEFAULT_GATEWAY_RETRY_S,
        timeout_s: float = 60.0,
    ) -> None:
        self._servers = [u.strip().rstrip("/") for u in servers.split(",") if u.strip()]
        if not self._servers:
            raise LogbrokerError(f"--server {servers!r} names no gateway URL")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._clients = [
            httpx.Client(base_url=url, headers=headers, timeout=timeout_s) for url in self._servers
        ]
        self._command = command
        self._retry_s = retry_s
        self._current = 0
        """The gateway asked first: the last one that answered."""
        self._said_waiting = False
        self.asked_again_after_sending = False
        """Whether the last request was asked again after an attempt that may have reached a
        gateway (and may have been carried out there, its answer lost)."""

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients:
            client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response:
        """The first answer to ``method path`` that is not 502, 503, 504 or a connection that
        failed; :class:`GatewayStillUnavailable` once the bound passed without one."""
        deadline = time.monotonic() + self._retry_s
        pause = _FIRST_PAUSE_S
        failures: dict[str, str] = {}
        """Each gateway's last failure, named when the request gives up."""
        maybe_sent = False
        self.asked_again_after_sending = False
        while True:
            wait_at_least = 0.0
            for _ in self._servers:
                server = self._servers[self._current]
                self.asked_again_after_sending = maybe_sent
                try:
                    response = self._clients[self._current].request(
                        method, path, json=json, params=params
                    )
                except httpx.UnsupportedProtocol:
                    raise  # a URL without http:// or https://: no wait makes it right
                except httpx.ConnectError as exc:  # refused, no route: nothing was sent
                    failures[server] = f"{server} unreachable: {str(exc) or type(exc).__name__}"
                except httpx.TransportError as exc:  # reset, cut off, timed out: maybe sent
                    maybe_sent = True
                    failures[server] = f"{server} failed: {str(exc) or type(exc).__name__}"
                else:
                    if response.status_code not in RETRIED_STATUSES:
                        return response
                    maybe_sent = True
                    failures[server] = f"{server} answered {_status_and_reason(response)}"
                    wait_at_least = max(wait_at_least, retry_after_s(response))
                if not self._said_waiting and self._retry_s > 0:
                    self._said_waiting = True
                    print(
                        f"logbroker {self._command}: {failures[server]}; waiting for a gateway "
                        f"to answer, for up to {self._retry_s:g} s (--gateway-retry)",
                        file=sys.stderr,
                        flush=True,
                    )
                self._current = (self._current + 1) % len(self._servers)
            left = deadline - time.monotonic()
            if left <= 0:
                raise GatewayStillUnavailable(
                    f"no gateway answered {method} {path} within {self._retry_s:g} s "
                    f"(--gateway-retry): {'; '.join(failures[s] for s in self._servers)}"
                )
            time.sleep(min(left, max(pause, wait_at_least)))
            pause = min(pause * 2, _MAX_PAUSE_S)


def _status_and_reason(response: httpx.Response) -> str:
    """``503 partition_unavailable: <reason>`` (or the start of a body that is not JSON)."""
    try:
        body = response.json()
        return f"{response.status_code} {body['error']}: {body['reason']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {' '.join(response.text[:200].split())}"
