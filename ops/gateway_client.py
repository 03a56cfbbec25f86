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
again gets the same answer) is returned at once.  The loop is
:class:`delivery.gateway_retry.GatewayRetry`, the one the loader's reads through gateways use.

The URLs of ``--server`` must be gateways of one installation: with several, every one is
asked which installation it belongs to (``/healthz``) at the command's start, at once, and
again before its first request after it failed (or if it did not answer at the start); one
of another installation than the others is refused
(:class:`~delivery.installations.MixedInstallations`, exit status 2) before anything is asked
of it, since a request the first could not answer would be carried out in another log.

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
from typing import Any

import httpx

from delivery.gateway_retry import GatewayRetry, StillUnavailable, gateway_urls
from log_store.errors import LogbrokerError
from ops.commands.arg_types import seconds

DEFAULT_GATEWAY_RETRY_S = 30.0
EXIT_UNAVAILABLE = 4
"""The exit status of a command whose gateways stayed unavailable for ``--gateway-retry``."""
RETRIED_STATUSES = frozenset({502, 503, 504})
"""Not 429: a command's 429 is a limit (``max_topics``, ``max_partitions_per_topic``) that
waiting does not lift."""


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
    starts waiting.  With several, every one is asked its installation here, at once:
    :class:`~delivery.installations.MixedInstallations` if two name different ones."""

    def __init__(
        self,
        servers: str,
        *,
        command: str,
        token: str | None = None,
        retry_s: float = DEFAULT_GATEWAY_RETRY_S,
        timeout_s: float = 60.0,
    ) -> None:
        urls = gateway_urls(servers)
        if not urls:
            raise LogbrokerError(f"--server {servers!r} names no gateway URL")
        self._command = command
        self._said_waiting = False
        self._gateways = GatewayRetry(
            urls,
            token=token,
            timeout_s=timeout_s,
            retry_s=retry_s,
            retried_statuses=RETRIED_STATUSES,
            describe_answer=lambda _path, response: _status_and_reason(response),
            on_waiting=self._say_waiting,
            installation_why="a request one of them cannot answer would be carried out in "
            "another installation's log",
        )
        self.asked_again_after_sending = False
        """Whether the last request was asked again after an attempt that may have reached a
        gateway (and may have been carried out there, its answer lost)."""
        try:
            self._gateways.ask_every_gateway()
        except BaseException:
            self._gateways.close()
            raise

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._gateways.close()

    def _say_waiting(self, failure: str) -> None:
        """Said once per command, at the first failure that makes it wait."""
        if self._said_waiting:
            return
        self._said_waiting = True
        print(
            f"logbroker {self._command}: {failure}; waiting for a gateway to answer, for up "
            f"to {self._gateways.retry_s:g} s (--gateway-retry)",
            file=sys.stderr,
            flush=True,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response:
        """The first answer to ``method path`` that is not 502, 503, 504 or a connection that
        failed; :class:`GatewayStillUnavailable` once the bound passed without one, and
        :class:`~delivery.installations.MixedInstallations` (a ``LogbrokerError``) for a
        gateway of another installation than the others of ``--server``."""
        self.asked_again_after_sending = False
        try:
            answer = self._gateways.request(method, path, json=json, params=params)
        except StillUnavailable as exc:
            raise GatewayStillUnavailable(
                f"no gateway answered {method} {path} within {self._gateways.retry_s:g} s "
                f"(--gateway-retry): {exc}"
            ) from None
        self.asked_again_after_sending = answer.asked_again_after_sending
        return answer.response


def _status_and_reason(response: httpx.Response) -> str:
    """``503 partition_unavailable: <reason>`` (or the start of a body that is not JSON)."""
    try:
        body = response.json()
        return f"{response.status_code} {body['error']}: {body['reason']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {' '.join(response.text[:200].split())}"
