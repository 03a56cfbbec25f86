"""A request to an installation's gateways, waited out while none of them can answer it.

``logbroker schemas``, ``topics --server`` and ``audit --windows --server``
(``ops/gateway_client.py``) and the loader's reads through gateways
(``yt_loader/log_source.py``) ask with this one loop.  A request that finds a gateway of
``--server URL[,URL...]`` unreachable, cut off, or answering one of the caller's
``retried_statuses`` (502, 503, 504: a gateway starting, stopping or without its store, a
Kafka partition between owners, a load balancer with no gateway behind it) goes to the next
at once; once every one failed, it is asked again after a pause (0.5 s growing to 5 s, or what
``Retry-After`` asks for, at most 30 s), until ``retry_s`` have passed: then
:class:`StillUnavailable`, naming each gateway's last failure.  Any other answer is the
request's own and is returned at once.

With several URLs, each gateway is asked which installation it belongs to (``/healthz``)
before its first request and again after it failed, and one of another installation than
the others is refused (:class:`~delivery.installations.MixedInstallations`): a request the
first cannot answer must not be carried out in another log.  A command asks them all at its
start too (:meth:`GatewayRetry.ask_every_gateway`), so that a wrong URL is refused at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from delivery.installations import HEALTH_PATH, OneInstallation, ask_every_gateway
from log_store.errors import LogbrokerError

FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 5.0
MAX_RETRY_AFTER_S = 30.0


def gateway_urls(text: str) -> tuple[str, ...]:
    """The gateways of ``URL[,URL...]`` (one installation), in order: each stripped of blanks
    and of a trailing ``/``, empty items left out (so a text of only commas names none).  The
    one splitter of every ``--server`` (the push-client's groups' too) and of the loader's
    ``server``; each caller refuses what it cannot use (none, or one that is no http(s) URL)
    with its own message."""
    return tuple(url.strip().rstrip("/") for url in text.split(",") if url.strip())


def retry_after_given(response: httpx.Response) -> float | None:
    """The seconds ``Retry-After`` gives (a finite number, 0 or more), None without one.  The
    one reading of the header; each caller bounds what it waits (:func:`retry_after_s`)."""
    try:
        value = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def retry_after_s(response: httpx.Response) -> float:
    """The seconds ``Retry-After`` asks for (a number; at most 30), else 0."""
    given = retry_after_given(response)
    return 0.0 if given is None else min(given, MAX_RETRY_AFTER_S)


class StillUnavailable(LogbrokerError):
    """Every gateway stayed unreachable or answered a retried status for the whole bound;
    ``failures``: each gateway's last failure, in the order of the URLs."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__("; ".join(failures))
        self.failures = failures


@dataclass(frozen=True, slots=True)
class Answer:
    response: httpx.Response
    asked_again_after_sending: bool
    """Whether the request was asked again after an attempt that may have reached a gateway
    (a connection cut after it was sent, a retried status): that attempt may have been
    carried out there, its answer lost."""


class _Failed(Exception):
    """One attempt's failure: ``text`` names it; ``maybe_sent``: it may have been carried out."""

    def __init__(self, text: str, *, maybe_sent: bool, wait_at_least_s: float = 0.0) -> None:
        super().__init__(text)
        self.text = text
        self.maybe_sent = maybe_sent
        self.wait_at_least_s = wait_at_least_s


class GatewayRetry:
    """Requests to the gateways ``servers`` (of one installation), each waited out as the
    module says.

    ``describe_answer(path, response)`` words a retried answer (what follows "URL answered ");
    ``on_waiting(failure)`` is told a request's first failure, when it is going to wait
    (``retry_s`` above 0); ``installation_why`` ends the refusal of a gateway of another
    installation (what would go wrong there); ``installation``: (URL, installation id) the
    gateways are known to belong to (learnt before, elsewhere)."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        token: str | None,
        timeout_s: float,
        retry_s: float,
        retried_statuses: frozenset[int],
        describe_answer: Callable[[str, httpx.Response], str],
        on_waiting: Callable[[str], None],
        installation_why: str,
        installation: tuple[str, str] | None = None,
    ) -> None:
        if not servers:
            raise ValueError("no gateway URL")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.servers = tuple(servers)
        self._clients = [
            httpx.Client(base_url=url, headers=headers, timeout=timeout_s) for url in self.servers
        ]
        self.retry_s = retry_s
        self._retried = retried_statuses
        self._describe = describe_answer
        self._on_waiting = on_waiting
        self._installation = OneInstallation(installation_why, installation)
        self._asked = [len(self.servers) < 2] * len(self.servers)
        """Whether each gateway was asked which installation it belongs to since it last
        failed (one URL has no other to be checked against)."""
        self._current = 0
        """The gateway asked first: the last one that answered."""

    @property
    def current(self) -> str:
        """The gateway that gave the last answer (asked first next time)."""
        return self.servers[self._current]

    @property
    def installation(self) -> tuple[str, str] | None:
        """(URL, installation id) of the first gateway that named the installation, if any."""
        return self._installation.known

    def ask_every_gateway(self) -> None:
        """With several gateways, ask each its installation now, at once (see
        :func:`delivery.installations.ask_every_gateway`): raises
        :class:`~delivery.installations.MixedInstallations` if two name different ones."""
        if len(self.servers) < 2:
            return
        checked = ask_every_gateway(
            self._installation, list(zip(self.servers, self._clients, strict=True))
        )
        self._asked = [asked or now for asked, now in zip(self._asked, checked, strict=True)]

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
    ) -> Answer:
        """The first answer to ``method path`` that is not a retried status or a connection
        that failed; :class:`StillUnavailable` once ``retry_s`` passed without one.

        ``httpx.UnsupportedProtocol`` (a URL without ``http://`` or ``https://``) and any
        :class:`httpx.HTTPError` that is no transport failure are raised at once: no wait
        makes them right."""
        deadline = time.monotonic() + self.retry_s
        pause = FIRST_PAUSE_S
        failures: dict[str, str] = {}
        """Each gateway's last failure, named when the request gives up."""
        maybe_sent = False
        while True:
            wait_at_least = 0.0
            for _ in self.servers:
                server = self.current
                try:
                    response = self._attempt(method, path, json, params)
                except _Failed as failed:
                    maybe_sent = maybe_sent or failed.maybe_sent
                    wait_at_least = max(wait_at_least, failed.wait_at_least_s)
                    self._asked[self._current] = len(self.servers) < 2
                    if not failures and self.retry_s > 0:
                        self._on_waiting(failed.text)
                    failures[server] = failed.text
                    self._current = (self._current + 1) % len(self.servers)
                else:
                    return Answer(response, maybe_sent)
            left = deadline - time.monotonic()
            if left <= 0:
                raise StillUnavailable([failures[s] for s in self.servers])
            time.sleep(min(left, max(pause, wait_at_least)))
            pause = min(pause * 2, MAX_PAUSE_S)

    def _attempt(
        self, method: str, path: str, json: Any, params: dict[str, Any] | None
    ) -> httpx.Response:
        """One gateway's answer, checked to be of the installation first if it was not since
        it last failed; :class:`_Failed` if it is one to ask again."""
        if not self._asked[self._current]:
            try:
                healthz = self._send("GET", HEALTH_PATH, None, None)
            except _Failed as failed:  # the request itself was not sent
                raise _Failed(
                    failed.text, maybe_sent=False, wait_at_least_s=failed.wait_at_least_s
                ) from None
            failure = self._installation.check(self.current, healthz, several=True)
            if failure is not None:
                raise _Failed(f"{self.current} {failure}", maybe_sent=False)
            self._asked[self._current] = True
        return self._send(method, path, json, params)

    def _send(
        self, method: str, path: str, json: Any, params: dict[str, Any] | None
    ) -> httpx.Response:
        server = self.current
        try:
            response = self._clients[self._current].request(method, path, json=json, params=params)
        except httpx.UnsupportedProtocol:
            raise  # a URL without http:// or https://: no wait makes it right
        except httpx.ConnectError as exc:  # refused, no route: nothing was sent
            raise _Failed(
                f"{server} unreachable: {str(exc) or type(exc).__name__}", maybe_sent=False
            ) from None
        except httpx.TransportError as exc:  # reset, cut off, timed out: maybe sent
            raise _Failed(
                f"{server} failed: {str(exc) or type(exc).__name__}", maybe_sent=True
            ) from None
        if response.status_code in self._retried:
            raise _Failed(
                f"{server} answered {self._describe(path, response)}",
                maybe_sent=True,
                wait_at_least_s=retry_after_s(response),
            )
        return response
